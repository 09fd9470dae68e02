#pragma once
// Which kernel variant this process runs, chosen once at start-up from what
// the CPU supports (runtime dispatch as ATen's DispatchStub and llama.cpp's
// CPU variants do it).
//
// Every hot kernel (Linear's packed GEMM, paged attention, the sampler's
// loops) exists once per CpuIsa, each variant in its own translation unit
// compiled with that ISA's target flags (CMakeLists.txt: sources named
// *_avx512.cpp, *_avx2.cpp, *_portable.cpp). Everything else is compiled for
// the portable baseline, so one binary runs on any x86-64-v2 CPU and uses
// AVX2 or AVX-512 only where the CPU has them.
//
// The choice: the best variant the CPU and OS support, unless the environment
// variable TROUPE_CPU (portable | avx2 | avx512 | avx512bf16) asks for a lower one (to run
// and measure the AVX2 code on an AVX-512 host). Asking for a variant the CPU
// cannot run is an error (std::runtime_error from kernel_isa()), never a
// silent downgrade. Tests and benchmarks switch variants with
// set_kernel_isa / ScopedKernelIsa.
#include <string>
#include <vector>

#include "core/host_info.hpp"

namespace troupe::model {

// Instruction-set levels of the kernel variants, lowest first.
enum class CpuIsa : int {
  kPortable =
      0,      // x86-64-v2 (SSE4.2): any x86-64 CPU of the last ~15 years; BLAS where a kernel has no variant
  kAvx2 = 1,  // x86-64-v3: AVX2 + FMA (+ BMI1/2, F16C, MOVBE), 16 ymm registers
  kAvx512 = 2,  // x86-64-v4: AVX-512 F/BW/CD/DQ/VL, 32 zmm registers
  // x86-64-v4 + AVX512_BF16 + AVX512_VNNI (Zen 4/5, Cooper Lake, Sapphire
  // Rapids and later): kAvx512's kernels, except that bfloat16 weights run
  // on vdpbf16ps (x rounded to bfloat16, two multiply-adds a lane per
  // instruction) where that is fast (bf16_dot(): on AMD) and int8 weights on
  // vpdpwssd (x quantized to int16 per row, exact int32 sums);
  // linear_avx512bf16.cpp. TROUPE_CPU=avx512 on such a CPU keeps both
  // widened to fp32 instead.
  kAvx512Bf16 = 3,
};

// Every variant, lowest first.
const std::vector<CpuIsa>& all_isas();

const char* to_string(CpuIsa isa);  // "portable" | "avx2" | "avx512" | "avx512bf16"
// Inverse of to_string; anything else throws std::invalid_argument naming the choices.
CpuIsa parse_isa(const std::string& name);

// Whether this CPU and its OS (saved vector state) can run the variant.
bool cpu_supports(CpuIsa isa);
// Empty when supported, else why not ("AMD EPYC 7B13 lacks AVX-512 ...").
std::string why_unsupported(CpuIsa isa);
// The highest supported variant.
CpuIsa best_isa();

// "model name" of the first processor in /proc/cpuinfo, or "unknown CPU".
using core::cpu_model_name;

// The variant a process starts with when TROUPE_CPU holds `env_value` (null
// or empty: unset): best_isa(), or the named variant. Throws
// std::runtime_error naming TROUPE_CPU for an unknown name or a variant this
// CPU cannot run.
CpuIsa choose_kernel_isa(const char* env_value);

// The variant the kernels run now: choose_kernel_isa(getenv("TROUPE_CPU"))
// on first use, then whatever set_kernel_isa chose. Throws std::runtime_error when TROUPE_CPU names an
// unknown variant or one this CPU cannot run.
CpuIsa kernel_isa();
// Makes `isa` the variant kernels run from now on (thread-safe). Throws
// std::invalid_argument, and changes nothing, when the CPU cannot run it.
// A Linear keeps the variant it was packed for (see linear.hpp).
void set_kernel_isa(CpuIsa isa);

// Sets a variant for a scope and restores the previous one (tests, benches).
class ScopedKernelIsa {
 public:
  explicit ScopedKernelIsa(CpuIsa isa);
  ~ScopedKernelIsa();
  ScopedKernelIsa(const ScopedKernelIsa&) = delete;
  ScopedKernelIsa& operator=(const ScopedKernelIsa&) = delete;

 private:
  CpuIsa saved_;
};

// Where a product of one row (a batch-1 step) prefetches the next chunk of
// its weights: in every variant for bfloat16 and int8 weights (the avx2
// kernel for its one-tile products of up to 6 rows); fp32 leaves one row to
// the hardware prefetcher, but for avx2's one tile where the level is L2
// (linear_avx2.cpp). One row reads each line once, and how many prefetches a core
// keeps in flight into each level differs by vendor: measured by
// `bench_limits --floor` on both machines of the team, into L1 on AMD (Zen 5:
// batch-1 int8 products 5-13% faster, bf16 8-9%, than into L2), into L2
// on Intel (Xeon Emerald Rapids: the bf16 step 1.43x -> 1.21x its floor,
// int8 1.33-1.44x -> 1.09-1.31x, than into L1). The environment variable
// TROUPE_ONE_ROW_PREFETCH (l1 | l2) overrides the choice, to measure it.
enum class CacheLevel : int { kL1 = 1, kL2 = 2 };
const char* to_string(CacheLevel level);  // "L1" | "L2"
// The level for TROUPE_ONE_ROW_PREFETCH = `env_value` (null or empty: unset)
// on a CPU that is (`amd`) or is not AMD's. Throws std::runtime_error naming
// the variable for anything but l1 or l2.
CacheLevel choose_one_row_prefetch(const char* env_value, bool amd);
// This process's level: choose_one_row_prefetch(getenv(...), this CPU),
// decided on first use; never throws (a bad value gives the CPU's default:
// troupe's commands refuse it at start, as they refuse a bad TROUPE_CPU).
CacheLevel one_row_prefetch();

// Whether the avx512bf16 variant runs bfloat16 weights on vdpbf16ps (the
// matrices' inputs rounded to bfloat16 too: llama.cpp BF16's arithmetic) or
// widens them to fp32 in registers as the avx512 variant does (int8 stays on
// vpdpwssd either way). vdpbf16ps does two multiply-adds a lane, and on AMD
// (measured on Zen 5; Zen 4 not measured) it issues as often as an FMA: a
// bfloat16 prefill ran 1.5x, a 64-sequence decode step 1.6-1.7x faster than
// fp32's. On Intel (measured on Xeon Emerald Rapids only) it issues at a quarter of the FMA's rate (0.73-0.88
// ns against 0.185 ns an instruction): the same steps ran 0.51-0.58x and
// 0.67-0.68x of fp32's, against 0.79-0.82x and 0.97-1.02x widened (each chunk
// widened once, linear_avx512.cpp). So: on AMD, not elsewhere.
// TROUPE_BF16_DOT (1 | 0) overrides the choice, to measure it.
// choose_bf16_dot: the choice for TROUPE_BF16_DOT = `env_value` (null or
// empty: unset) on a CPU that is (`amd`) or is not AMD's; throws
// std::runtime_error naming the variable for anything but 1 or 0.
bool choose_bf16_dot(const char* env_value, bool amd);
// This process's choice: choose_bf16_dot(getenv(...), this CPU) on first use
// (a bad value gives the CPU's default; troupe's commands refuse it at
// start), then whatever set_bf16_dot chose. A Linear keeps the arithmetic it
// was packed for; a model's Linears are all packed under one choice, so a
// sequence's tokens still do not depend on its batch.
bool bf16_dot();
void set_bf16_dot(bool on);  // thread-safe
// Sets the choice for a scope and restores the previous one (tests, benches).
class ScopedBf16Dot {
 public:
  explicit ScopedBf16Dot(bool on);
  ~ScopedBf16Dot();
  ScopedBf16Dot(const ScopedBf16Dot&) = delete;
  ScopedBf16Dot& operator=(const ScopedBf16Dot&) = delete;

 private:
  bool saved_;
};

// One line for --version, logs and bench headers, e.g.
// "cpu: AMD EPYC 9B45 | kernels: avx512 (linear 6x64, attention, sampler) | supported: portable avx2 avx512".
std::string kernel_summary();

}  // namespace troupe::model
