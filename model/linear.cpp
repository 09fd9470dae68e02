#include "model/linear.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "model/kernel_team.hpp"
#include "model/linear_kernel.hpp"
#include "model/safetensors.hpp"

namespace troupe::model {
namespace {

// Multiply-adds below which a call stays on the calling thread (waking a
// sleeping OpenMP worker costs more than the work).
constexpr int64_t kMinFmaPerThread = int64_t{1} << 17;

[[noreturn]] void bad(const std::string& who, const std::string& what) {
  throw std::invalid_argument(who + ": " + what);
}

std::string shape_str(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// Uninitialised [P, K, nr] of `dtype`. From 2 MiB up, in 2 MiB-aligned
// memory advised for transparent huge pages: a decode step streams every
// weight once, and with 4 KiB pages that is a TLB miss every 16 panel rows.
torch::Tensor packed_buffer(int64_t P, int64_t K, int64_t nr, torch::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(P * K * nr) * c10::elementSize(dtype);
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes < kHuge) return at::empty({P, K, nr}, dtype);
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* mem = std::aligned_alloc(kHuge, rounded);
  if (!mem) throw std::bad_alloc();
  madvise(mem, rounded, MADV_HUGEPAGE);  // advice only: without THP this is plain memory
  return at::from_blob(
      mem, {P, K, nr}, [](void* m) { std::free(m); }, torch::TensorOptions().dtype(dtype));
}

// Symmetric int8 weights: q and their fp32 scales.
struct Int8Weight {
  torch::Tensor q;      // int8: per channel, t's shape; per group, [K, N]
  torch::Tensor scale;  // fp32: per channel [out]; per group [groups, out]
};

// Output channels quantized together: the temporaries of the arithmetic
// (|W|, W / scale in fp32) are this many channels' worth, not the matrix's —
// for wte (50257 x 768) 12.6 MB instead of 154 MB each, so loading an int8
// model peaks at its fp32 source plus little more. Each channel's values do
// not depend on the block it is in.
constexpr int64_t kQuantizeBlock = 4096;

// A source still in its mapped file (SafetensorsFile::map) lets go of
// the pages of the channels just quantized when they lie together (wte, [out,
// in]: 147 MiB of GPT-2's file is then never resident at once).
void done_with_channels(const torch::Tensor& t, int64_t out_dim, int64_t n0, int64_t nb) {
  const torch::Tensor part = t.narrow(out_dim, n0, nb);
  if (part.is_contiguous()) release_mapped_pages(part);
}

// Per output channel (see quantize_int8_per_channel).
Int8Weight quantize_int8(const torch::Tensor& t_in, WeightLayout layout) {
  const int64_t in_dim = layout == WeightLayout::kInOut ? 0 : 1, out_dim = 1 - in_dim;
  const int64_t N = t_in.size(out_dim);
  Int8Weight out{at::empty(t_in.sizes(), torch::kChar), at::empty({N}, torch::kFloat32)};
  for (int64_t n0 = 0; n0 < N; n0 += kQuantizeBlock) {
    const int64_t nb = std::min(kQuantizeBlock, N - n0);
    // The arithmetic is fp32's whatever the source.
    const torch::Tensor t = t_in.narrow(out_dim, n0, nb).to(torch::kFloat32);
    const torch::Tensor scale = t.abs().amax(in_dim, /*keepdim=*/true) / 127.0f;
    const torch::Tensor divisor = at::where(scale > 0, scale, at::ones_like(scale));
    torch::Tensor q = t / divisor;
    q.round_().clamp_(-127, 127);  // round: to nearest, ties to even
    out.q.narrow(out_dim, n0, nb).copy_(q);
    out.scale.narrow(0, n0, nb).copy_(scale.reshape({-1}));
    done_with_channels(t_in, out_dim, n0, nb);
  }
  return out;
}

// Symmetric int8 per group of kInt8Group inputs of each output channel (see
// quantize_int8_groups_of_32): q [K, N] (as kInOut, whatever t's layout),
// scale [groups, N].
Int8Weight quantize_int8_g32(const torch::Tensor& t_in, WeightLayout layout) {
  const torch::Tensor w = layout == WeightLayout::kInOut ? t_in : t_in.t();  // [K, N]
  const int64_t K = w.size(0), N = w.size(1), G = (K + kInt8Group - 1) / kInt8Group;
  Int8Weight out{at::empty({K, N}, torch::kChar), at::empty({G, N}, torch::kFloat32)};
  for (int64_t n0 = 0; n0 < N; n0 += kQuantizeBlock) {
    const int64_t nb = std::min(kQuantizeBlock, N - n0);
    const torch::Tensor padded = at::zeros({G * kInt8Group, nb}, torch::kFloat32);  // zeros change no maximum
    padded.narrow(0, 0, K).copy_(w.narrow(1, n0, nb));
    const torch::Tensor groups = padded.view({G, kInt8Group, nb});
    const torch::Tensor scale = groups.abs().amax(1, /*keepdim=*/true) / 127.0f;  // [G, 1, nb]
    const torch::Tensor divisor = at::where(scale > 0, scale, at::ones_like(scale));
    torch::Tensor q = groups / divisor;
    q.round_().clamp_(-127, 127);
    out.q.narrow(1, n0, nb).copy_(q.view({G * kInt8Group, nb}).narrow(0, 0, K));
    out.scale.narrow(1, n0, nb).copy_(scale.view({G, nb}));
    done_with_channels(t_in, layout == WeightLayout::kInOut ? 1 : 0, n0, nb);
  }
  return out;
}

// packed[p][k][j] = W[k][p * nr + j] for panel p of a source in `layout`
// (K x N as [K, N] for kInOut, [N, K] for kOutIn), zero past column N.
template <typename T>
void pack_panel(const T* s, bool in_out, int64_t K, int64_t N, int64_t nr, int64_t p, T* d) {
  const int64_t ncols = std::min(nr, N - p * nr);
  if (ncols < nr)
    for (int64_t k = 0; k < K; ++k) std::fill_n(d + k * nr + ncols, nr - ncols, T{0});
  if (in_out) {
    for (int64_t k = 0; k < K; ++k) std::copy_n(s + k * N + p * nr, ncols, d + k * nr);
  } else {
    for (int64_t j = 0; j < ncols; ++j) {
      const T* row = s + (p * nr + j) * K;
      for (int64_t k = 0; k < K; ++k) d[k * nr + j] = row[k];
    }
  }
}

// A panel [Kp, nr] (Kp even, rows past K zero) as pairs of rows in place of
// it: [Kp / 2][nr][2] (linear_kernel.hpp's PackedGemmKernel::pairs).
template <typename T>
void interleave_pairs(const T* panel, int64_t Kp, int64_t nr, T* d) {
  for (int64_t k = 0; k < Kp; ++k)
    for (int64_t j = 0; j < nr; ++j) d[(k / 2 * nr + j) * 2 + k % 2] = panel[k * nr + j];
}

// W (K x N in its layout: [K, N] when in_out, else [N, K]) packed in P
// panels of nr columns, as [P, K, nr] of `dtype` (T's), or as pairs of rows
// ([P, Kp / 2, nr, 2] with Kp = K rounded up to even, a zero row past K).
template <typename T>
torch::Tensor pack_panels(const T* s, bool in_out, int64_t P, int64_t K, int64_t N, int64_t nr, bool pairs,
                          torch::ScalarType dtype) {
  const int64_t Kp = pairs ? (K + 1) / 2 * 2 : K;
  torch::Tensor packed = packed_buffer(P, Kp, nr, dtype);
  T* dst = static_cast<T*>(packed.data_ptr());
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    std::vector<T> panel(pairs ? static_cast<size_t>(Kp * nr) : 0, T{0});
    for (int64_t p = p0; p < p1; ++p) {
      if (!pairs) {
        pack_panel(s, in_out, K, N, nr, p, dst + p * K * nr);
        continue;
      }
      pack_panel(s, in_out, K, N, nr, p, panel.data());
      interleave_pairs(panel.data(), Kp, nr, dst + p * Kp * nr);
    }
  });
  return packed;
}

// Element (k, j) of a panel of Kp rows, plain or as pairs.
inline int64_t panel_index(bool pairs, int64_t k, int64_t j, int64_t nr) {
  return pairs ? (k / 2 * nr + j) * 2 + k % 2 : k * nr + j;
}

}  // namespace

WeightDtype parse_weight_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return WeightDtype::kFloat32;
  if (name == "bfloat16" || name == "bf16") return WeightDtype::kBFloat16;
  if (name == "int8") return WeightDtype::kInt8;
  if (name == "int8_g32") return WeightDtype::kInt8G32;
  throw std::invalid_argument("weight dtype '" + name + "': expected float32, bfloat16, int8 or int8_g32");
}

const char* to_string(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kFloat32:
      return "float32";
    case WeightDtype::kBFloat16:
      return "bfloat16";
    case WeightDtype::kInt8:
      return "int8";
    case WeightDtype::kInt8G32:
      return "int8_g32";
  }
  return "float32";
}

torch::Tensor round_to_bfloat16(const torch::Tensor& t) { return t.to(torch::kBFloat16).to(t.scalar_type()); }

torch::Tensor quantize_int8_groups_of_32(const torch::Tensor& t, WeightLayout layout) {
  if (!t.defined() || t.dim() != 2) bad("quantize_int8_groups_of_32", "the weight must be a 2-D tensor");
  const Int8Weight w = quantize_int8_g32(t, layout);
  const int64_t K = w.q.size(0), N = w.q.size(1), G = w.scale.size(0);
  const torch::Tensor per_row = w.scale.unsqueeze(1).expand({G, kInt8Group, N}).reshape({G * kInt8Group, N});
  const torch::Tensor d = w.q.to(torch::kFloat32) * per_row.narrow(0, 0, K);
  return layout == WeightLayout::kInOut ? d : d.t().contiguous();
}

torch::Tensor quantize_int8_per_channel(const torch::Tensor& t, WeightLayout layout) {
  if (!t.defined() || t.dim() != 2) bad("quantize_int8_per_channel", "the weight must be a 2-D tensor");
  const Int8Weight w = quantize_int8(t, layout);
  const torch::Tensor scale = layout == WeightLayout::kInOut ? w.scale.unsqueeze(0) : w.scale.unsqueeze(1);
  return w.q.to(torch::kFloat32) * scale;
}

static_assert(kInt8Group == kPackedGroupRows, "the kernels' groups are the quantizer's");

const PackedGemmKernel* packed_gemm_kernel(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
      return bf16_dot() ? &avx512bf16::kPackedGemm : &avx512bf16::kPackedGemmWidenedBf16;
    case CpuIsa::kAvx512:
      return &avx512::kPackedGemm;
    case CpuIsa::kAvx2:
      return &avx2::kPackedGemm;
    case CpuIsa::kPortable:
      return nullptr;
  }
  return nullptr;
}

Linear::Linear(const torch::Tensor& weight, WeightLayout layout, bool pack)
    : Linear(weight, layout, pack ? kernel_isa() : CpuIsa::kPortable) {}

Linear::Linear(const torch::Tensor& weight, WeightLayout layout, CpuIsa isa)
    : Linear(weight, layout, isa, WeightDtype::kFloat32) {}

Linear::Linear(const torch::Tensor& weight, WeightLayout layout, CpuIsa isa, WeightDtype dtype)
    : layout_(layout), dtype_(dtype) {
  if (!weight.defined() || weight.dim() != 2) bad("Linear", "the weight must be a 2-D tensor");
  if (!cpu_supports(isa)) bad("Linear", why_unsupported(isa));
  in_ = weight.size(layout == WeightLayout::kInOut ? 0 : 1);
  out_ = weight.size(layout == WeightLayout::kInOut ? 1 : 0);
  // fp32 weights, or a 16-bit file's (bfloat16, half) for a bfloat16 or int8
  // Linear: bfloat16 ones packed as they are (the bits fp32 weights round
  // to), the others widened as they are rounded or quantized, a block of
  // channels at a time (never a whole fp32 copy).
  const bool half_source = weight.scalar_type() == torch::kBFloat16 || weight.scalar_type() == torch::kHalf;
  if (half_source && dtype == WeightDtype::kFloat32)
    bad("Linear", "16-bit weights make a bfloat16 or int8 Linear; widen them with .to(torch::kFloat32)");
  if (weight.device().is_cpu() && (weight.scalar_type() == torch::kFloat32 || half_source))
    kernel_ = packed_gemm_kernel(isa);
  if (!kernel_) {
    switch (dtype) {
      case WeightDtype::kFloat32:
        weight_ = weight.contiguous();
        break;
      case WeightDtype::kBFloat16:
        weight_ = round_to_bfloat16(weight.to(torch::kFloat32)).contiguous();
        break;
      case WeightDtype::kInt8:
        weight_ = quantize_int8_per_channel(weight, layout).contiguous();
        break;
      case WeightDtype::kInt8G32:
        weight_ = quantize_int8_groups_of_32(weight, layout).contiguous();
        break;
    }
    return;
  }
  isa_ = isa;
  // Panels as fp32, as the bits of the bfloat16 rounding, or as int8 with
  // the columns' scales beside them.
  const int64_t nr = kernel_->nr;
  const int64_t P = (out_ + nr - 1) / nr, K = in_, N = out_;
  const bool in_out = layout == WeightLayout::kInOut;
  switch (dtype) {
    case WeightDtype::kFloat32: {
      const torch::Tensor src = weight.contiguous();
      weight_ = pack_panels(src.data_ptr<float>(), in_out, P, K, N, nr, false, torch::kFloat32);
      break;
    }
    case WeightDtype::kBFloat16: {
      // The bits of the bfloat16 rounding (to nearest, ties to even) of the
      // fp32 values (a half's, converted through its exact fp32 value).
      const torch::Tensor bits = weight.to(torch::kBFloat16).contiguous();
      weight_ = pack_panels(reinterpret_cast<const uint16_t*>(bits.data_ptr<at::BFloat16>()), in_out, P, K, N,
                            nr, kernel_->bf16_pairs, torch::kBFloat16);
      break;
    }
    case WeightDtype::kInt8: {
      const Int8Weight w = quantize_int8(weight.contiguous(), layout);
      const torch::Tensor q = w.q.contiguous();
      weight_ = pack_panels(q.data_ptr<int8_t>(), in_out, P, K, N, nr, kernel_->int8_pairs, torch::kChar);
      scales_ = at::zeros({P * nr}, torch::kFloat32);
      scales_.narrow(0, 0, N).copy_(w.scale);
      break;
    }
    case WeightDtype::kInt8G32: {
      const Int8Weight w = quantize_int8_g32(weight, layout);  // q [K, N], scale [G, N]
      weight_ = pack_panels(w.q.data_ptr<int8_t>(), /*in_out=*/true, P, K, N, nr, kernel_->int8_pairs,
                            torch::kChar);
      // [G, N] -> [P, G, nr], zero past column N.
      const int64_t G = w.scale.size(0);
      const torch::Tensor padded = at::zeros({G, P * nr}, torch::kFloat32);
      padded.narrow(1, 0, N).copy_(w.scale);
      scales_ = padded.view({G, P, nr}).permute({1, 0, 2}).contiguous();
      break;
    }
  }
}

torch::Device Linear::device() const {
  return weight_.defined() ? weight_.device() : torch::Device(torch::kCPU);
}

void Linear::check_args(const torch::Tensor& x, const torch::Tensor& bias, const char* who) const {
  if (!weight_.defined()) bad(who, "this Linear holds no weight (default-constructed)");
  if (!x.defined() || x.dim() != 2 || x.size(1) != in_)
    bad(who,
        "x must be [M, in = " + std::to_string(in_) + "], got " + (x.defined() ? shape_str(x) : "undefined"));
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != out_))
    bad(who, "bias must be [out = " + std::to_string(out_) + "], got " + shape_str(bias));
  if (kernel_) {
    auto fp32_cpu = [](const torch::Tensor& t) {
      return t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
    };
    if (!fp32_cpu(x) || (bias.defined() && !fp32_cpu(bias)))
      bad(who,
          "x and bias must be float32 CPU tensors like the packed weight; convert them with "
          ".to(torch::kFloat32)");
  }
}

void Linear::run_packed(const torch::Tensor& x_in, const torch::Tensor& bias_in, float* c, int64_t ldc,
                        bool accumulate, bool gelu) const {
  const torch::Tensor x = x_in.contiguous();
  const torch::Tensor bias = bias_in.defined() ? bias_in.contiguous() : bias_in;
  const int64_t M = x.size(0), K = in_, N = out_, P = weight_.size(0);
  if (M == 0) return;
  const float* xp = x.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const PackedGemmKernel& kernel = *kernel_;
  const int64_t per_panel = std::max<int64_t>(1, M * K * kernel.nr);
  const int64_t grain = std::max<int64_t>(1, kMinFmaPerThread / per_panel);
  if (dtype_ == WeightDtype::kBFloat16) {
    const auto* wp = reinterpret_cast<const uint16_t*>(weight_.data_ptr<at::BFloat16>());
    kernel_parallel_for(0, P, grain, [&](int64_t p0, int64_t p1) {
      kernel.run_bf16(xp, M, K, N, wp, bp, c, ldc, accumulate, gelu, p0, p1);
    });
    return;
  }
  if (dtype_ == WeightDtype::kInt8 || dtype_ == WeightDtype::kInt8G32) {
    const int8_t* wp = weight_.data_ptr<int8_t>();
    const float* sp = scales_.data_ptr<float>();
    const auto run = dtype_ == WeightDtype::kInt8 ? kernel.run_int8 : kernel.run_int8_g32;
    kernel_parallel_for(0, P, grain, [&](int64_t p0, int64_t p1) {
      run(xp, M, K, N, wp, sp, bp, c, ldc, accumulate, gelu, p0, p1);
    });
    return;
  }
  const float* wp = weight_.data_ptr<float>();
  kernel_parallel_for(0, P, grain, [&](int64_t p0, int64_t p1) {
    kernel.run(xp, M, K, N, wp, bp, c, ldc, accumulate, gelu, p0, p1);
  });
}

torch::Tensor Linear::forward(const torch::Tensor& x, const torch::Tensor& bias, Activation act) const {
  check_args(x, bias, "Linear::forward");
  if (kernel_) {
    torch::Tensor y = at::empty({x.size(0), out_}, x.options());
    run_packed(x, bias, y.data_ptr<float>(), out_, /*accumulate=*/false, act == Activation::kGeluTanh);
    return y;
  }
  const torch::Tensor y = forward_blas(x, bias);
  return act == Activation::kGeluTanh ? at::gelu(y, "tanh") : y;
}

torch::Tensor Linear::forward_blas(const torch::Tensor& x, const torch::Tensor& bias) const {
  // As the model did before packing: one row through GEMV (OpenBLAS's SGEMM
  // with M = 1 is several times slower), more through GEMM.
  const torch::Tensor wt = layout_ == WeightLayout::kInOut ? weight_.t() : weight_;  // [out, in]
  if (x.size(0) == 1) {
    const torch::Tensor x0 = x.select(0, 0);
    return (bias.defined() ? at::addmv(bias, wt, x0) : at::mv(wt, x0)).unsqueeze(0);
  }
  const torch::Tensor w = wt.t();  // [in, out]
  return bias.defined() ? at::addmm(bias, x, w) : at::mm(x, w);
}

void Linear::forward_add_(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& bias) const {
  const char* who = "Linear::forward_add_";
  check_args(x, bias, who);
  if (!out.defined() || out.dim() != 2 || out.size(0) != x.size(0) || out.size(1) != out_)
    bad(who, "out must be [M = " + std::to_string(x.size(0)) + ", out = " + std::to_string(out_) + "], got " +
                 (out.defined() ? shape_str(out) : "undefined"));
  if (kernel_) {
    if (!out.device().is_cpu() || out.scalar_type() != torch::kFloat32)
      bad(who, "out must be a float32 CPU tensor like the packed weight");
    if (out.is_contiguous())
      run_packed(x, bias, out.data_ptr<float>(), out_, /*accumulate=*/true);
    else
      out.add_(forward(x, bias));
    return;
  }
  const torch::Tensor wt = layout_ == WeightLayout::kInOut ? weight_.t() : weight_;  // [out, in]
  if (x.size(0) == 1) {
    torch::Tensor o = out.select(0, 0);
    o.addmv_(wt, x.select(0, 0));
    if (bias.defined()) o.add_(bias);
    return;
  }
  out.addmm_(x, wt.t());
  if (bias.defined()) out.add_(bias);
}

torch::Tensor Linear::embedding(const torch::Tensor& ids) const {
  if (!weight_.defined()) bad("Linear::embedding", "this Linear holds no weight (default-constructed)");
  if (!ids.defined() || ids.dim() != 1 || !at::isIntegralType(ids.scalar_type(), /*includeBool=*/false))
    bad("Linear::embedding", "ids must be a 1-D integer tensor");
  if (!kernel_) {
    const torch::Tensor idx = ids.to(weight_.device(), torch::kLong);
    return layout_ == WeightLayout::kOutIn ? weight_.index_select(0, idx)
                                           : weight_.index_select(1, idx).t().contiguous();
  }
  // Column n of W lies in panel n / nr at lane n % nr, one weight per nr of them.
  const int64_t nr = kernel_->nr;
  const torch::Tensor idx = ids.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t T = idx.size(0), K = in_;
  torch::Tensor e = at::empty({T, K}, weight_.options().dtype(torch::kFloat32));
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    if (ip[t] < 0 || ip[t] >= out_)
      bad("Linear::embedding",
          "id " + std::to_string(ip[t]) + " is outside [0, out = " + std::to_string(out_) + ")");
  float* ep = e.data_ptr<float>();
  if (dtype_ == WeightDtype::kBFloat16) {
    const auto* wp = reinterpret_cast<const uint16_t*>(weight_.data_ptr<at::BFloat16>());
    // Weight (k, column n) of a panel of K rows, or of pairs of them.
    const bool pairs = kernel_->bf16_pairs;
    const int64_t Kp = weight_.size(1);
    for (int64_t t = 0; t < T; ++t) {
      const uint16_t* src = wp + (ip[t] / nr) * Kp * nr;
      const int64_t j = ip[t] % nr;
      for (int64_t k = 0; k < K; ++k) {
        const uint16_t w = src[panel_index(pairs, k, j, nr)];
        const uint32_t bits = static_cast<uint32_t>(w) << 16;
        std::memcpy(ep + t * K + k, &bits, sizeof bits);
      }
    }
    return e;
  }
  if (dtype_ == WeightDtype::kInt8) {
    // q * scale in fp32: quantize_int8_per_channel's values, bit for bit.
    const int8_t* wp = weight_.data_ptr<int8_t>();
    const float* sp = scales_.data_ptr<float>();
    const bool pairs = kernel_->int8_pairs;
    const int64_t Kp = weight_.size(1);
    for (int64_t t = 0; t < T; ++t) {
      const int8_t* src = wp + (ip[t] / nr) * Kp * nr;
      const int64_t j = ip[t] % nr;
      const float s = sp[ip[t]];
      for (int64_t k = 0; k < K; ++k) ep[t * K + k] = static_cast<float>(src[panel_index(pairs, k, j, nr)]) * s;
    }
    return e;
  }
  if (dtype_ == WeightDtype::kInt8G32) {
    // q * its group's scale in fp32: quantize_int8_groups_of_32's values.
    const int8_t* wp = weight_.data_ptr<int8_t>();
    const float* sp = scales_.data_ptr<float>();
    const int64_t G = scales_.size(1);
    const bool pairs = kernel_->int8_pairs;
    const int64_t Kp = weight_.size(1);
    for (int64_t t = 0; t < T; ++t) {
      const int8_t* src = wp + (ip[t] / nr) * Kp * nr;
      const int64_t j = ip[t] % nr;
      const float* s = sp + (ip[t] / nr) * G * nr + j;
      for (int64_t k = 0; k < K; ++k)
        ep[t * K + k] = static_cast<float>(src[panel_index(pairs, k, j, nr)]) * s[k / kInt8Group * nr];
    }
    return e;
  }
  const float* wp = weight_.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* src = wp + (ip[t] / nr) * K * nr + ip[t] % nr;
    for (int64_t k = 0; k < K; ++k) ep[t * K + k] = src[k * nr];
  }
  return e;
}

namespace {
std::atomic<uint64_t> g_kernel_scratch_epoch{0};
}  // namespace

uint64_t kernel_scratch_epoch() { return g_kernel_scratch_epoch.load(std::memory_order_relaxed); }

void release_kernel_scratch() { g_kernel_scratch_epoch.fetch_add(1, std::memory_order_relaxed); }

}  // namespace troupe::model
