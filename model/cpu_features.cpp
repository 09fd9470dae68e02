#include "model/cpu_features.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace troupe::model {
namespace {

// libgcc's __builtin_cpu_supports checks CPUID and, for AVX and AVX-512, that
// the OS saves the ymm/zmm state (XGETBV), so a "yes" means the instructions
// run. The level names check every feature of the level (GCC >= 12).
bool detect(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable:
      return __builtin_cpu_supports("x86-64-v2");
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("x86-64-v3");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("x86-64-v4");
    case CpuIsa::kAvx512Bf16:
      return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512bf16") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

const char* level_features(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable:
      return "x86-64-v2: SSE4.2, POPCNT";
    case CpuIsa::kAvx2:
      return "x86-64-v3: AVX2, FMA, BMI1/2, F16C, MOVBE";
    case CpuIsa::kAvx512:
      return "x86-64-v4: AVX-512 F/BW/CD/DQ/VL";
    case CpuIsa::kAvx512Bf16:
      return "x86-64-v4 + AVX512_BF16 + AVX512_VNNI";
  }
  return "?";
}

// What each variant runs, for kernel_summary().
const char* kernels_of(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable:
      return "linear BLAS, attention and sampler for x86-64-v2";
    case CpuIsa::kAvx2:
      return "linear packed 6x16 ymm, attention and sampler for AVX2";
    case CpuIsa::kAvx512:
      return "linear packed 6x64 zmm, attention and sampler for AVX-512";
    case CpuIsa::kAvx512Bf16:
      return bf16_dot()
                 ? "linear packed 6x64 zmm, vdpbf16ps for bfloat16 and vpdpwssd for int8 weights, attention "
                   "and sampler for AVX-512"
                 : "linear packed 6x64 zmm, bfloat16 weights widened to fp32 (vdpbf16ps is slow here) and "
                   "vpdpwssd for int8 weights, attention and sampler for AVX-512";
  }
  return "?";
}

constexpr int kUnset = -1;
std::atomic<int> g_isa{kUnset};
std::mutex g_init;

}  // namespace

CpuIsa choose_kernel_isa(const char* env) {
  if (!env || !*env) return best_isa();
  CpuIsa want;
  try {
    want = parse_isa(env);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("TROUPE_CPU: ") + e.what());
  }
  if (!cpu_supports(want))
    throw std::runtime_error(
        "TROUPE_CPU=" + std::string(env) + ": " + why_unsupported(want) +
        "; unset TROUPE_CPU or choose a lower variant (best here: " + to_string(best_isa()) + ")");
  return want;
}

const std::vector<CpuIsa>& all_isas() {
  static const std::vector<CpuIsa> all = {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512,
                                           CpuIsa::kAvx512Bf16};
  return all;
}

const char* to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable:
      return "portable";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512bf16";
  }
  return "?";
}

CpuIsa parse_isa(const std::string& name) {
  for (CpuIsa isa : all_isas())
    if (name == to_string(isa)) return isa;
  std::string choices;
  for (size_t i = 0; i < all_isas().size(); ++i)
    choices += std::string(i == 0 ? "" : i + 1 == all_isas().size() ? " or " : ", ") + to_string(all_isas()[i]);
  throw std::invalid_argument("unknown kernel variant '" + name + "'; choose " + choices);
}

bool cpu_supports(CpuIsa isa) {
  static const bool supported[4] = {detect(CpuIsa::kPortable), detect(CpuIsa::kAvx2), detect(CpuIsa::kAvx512),
                                    detect(CpuIsa::kAvx512Bf16)};
  return supported[static_cast<int>(isa)];
}

std::string why_unsupported(CpuIsa isa) {
  if (cpu_supports(isa)) return "";
  return "this CPU (" + cpu_model_name() + ") cannot run the " + to_string(isa) + " kernels (" +
         level_features(isa) + ")";
}

CpuIsa best_isa() {
  if (cpu_supports(CpuIsa::kAvx512Bf16)) return CpuIsa::kAvx512Bf16;
  if (cpu_supports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (cpu_supports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kPortable;
}

CpuIsa kernel_isa() {
  int v = g_isa.load(std::memory_order_acquire);
  if (v != kUnset) return static_cast<CpuIsa>(v);
  std::lock_guard<std::mutex> lock(g_init);
  v = g_isa.load(std::memory_order_acquire);
  if (v == kUnset) {
    v = static_cast<int>(
        choose_kernel_isa(std::getenv("TROUPE_CPU")));  // throws: stays unset, the next call reports again
    g_isa.store(v, std::memory_order_release);
  }
  return static_cast<CpuIsa>(v);
}

void set_kernel_isa(CpuIsa isa) {
  if (!cpu_supports(isa)) throw std::invalid_argument("set_kernel_isa: " + why_unsupported(isa));
  std::lock_guard<std::mutex> lock(g_init);
  g_isa.store(static_cast<int>(isa), std::memory_order_release);
}

ScopedKernelIsa::ScopedKernelIsa(CpuIsa isa) : saved_(kernel_isa()) { set_kernel_isa(isa); }

ScopedKernelIsa::~ScopedKernelIsa() { set_kernel_isa(saved_); }

const char* to_string(CacheLevel level) { return level == CacheLevel::kL1 ? "L1" : "L2"; }

CacheLevel choose_one_row_prefetch(const char* env, bool amd) {
  if (!env || !*env) return amd ? CacheLevel::kL1 : CacheLevel::kL2;
  const std::string v = env;
  if (v == "l1" || v == "L1") return CacheLevel::kL1;
  if (v == "l2" || v == "L2") return CacheLevel::kL2;
  throw std::runtime_error("TROUPE_ONE_ROW_PREFETCH: '" + v + "' is not a cache level; choose l1 or l2");
}

CacheLevel one_row_prefetch() {
  static const CacheLevel level = [] {
    const bool amd = __builtin_cpu_is("amd");
    try {
      return choose_one_row_prefetch(std::getenv("TROUPE_ONE_ROW_PREFETCH"), amd);
    } catch (const std::runtime_error&) {
      return choose_one_row_prefetch(nullptr, amd);
    }
  }();
  return level;
}

bool choose_bf16_dot(const char* env, bool amd) {
  if (!env || !*env) return amd;
  const std::string v = env;
  if (v == "1") return true;
  if (v == "0") return false;
  throw std::runtime_error("TROUPE_BF16_DOT: '" + v +
                           "' is neither 1 (bfloat16 weights on vdpbf16ps) nor 0 (widened to fp32)");
}

namespace {
std::atomic<int> g_bf16_dot{kUnset};
}  // namespace

bool bf16_dot() {
  int v = g_bf16_dot.load(std::memory_order_acquire);
  if (v != kUnset) return v != 0;
  const bool amd = __builtin_cpu_is("amd");
  bool on = amd;
  try {
    on = choose_bf16_dot(std::getenv("TROUPE_BF16_DOT"), amd);
  } catch (const std::runtime_error&) {
  }
  int expected = kUnset;
  g_bf16_dot.compare_exchange_strong(expected, on ? 1 : 0, std::memory_order_acq_rel);
  return g_bf16_dot.load(std::memory_order_acquire) != 0;
}

void set_bf16_dot(bool on) { g_bf16_dot.store(on ? 1 : 0, std::memory_order_release); }

ScopedBf16Dot::ScopedBf16Dot(bool on) : saved_(bf16_dot()) { set_bf16_dot(on); }

ScopedBf16Dot::~ScopedBf16Dot() { set_bf16_dot(saved_); }

std::string kernel_summary() {
  std::string s = "cpu: " + cpu_model_name() + " | kernels: ";
  try {
    const CpuIsa isa = kernel_isa();
    s += std::string(to_string(isa)) + " (" + kernels_of(isa) + ")";
    if (isa != best_isa())
      s += " [forced by TROUPE_CPU or set_kernel_isa; best here: " + std::string(to_string(best_isa())) + "]";
  } catch (const std::exception& e) {
    s += std::string("none (") + e.what() + ")";
  }
  s += std::string(" | one-row prefetch into ") + to_string(one_row_prefetch());
  s += " | supported:";
  for (CpuIsa isa : all_isas())
    if (cpu_supports(isa)) s += std::string(" ") + to_string(isa);
  return s;
}

}  // namespace troupe::model
