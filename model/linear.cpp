#include "model/linear.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace troupe::model {
namespace {

constexpr int64_t kNr = 64;  // columns per packed panel: 4 zmm vectors
constexpr int kNv = 4;
constexpr int kMr = 6;  // rows per tile: 6 x 4 = 24 accumulators of the 32 zmm registers
// Rows of a panel that every row tile consumes before the next chunk: 384 x
// 256 B = 96 KiB, so the chunk stays in L2 while all tiles pass over it and
// the next one is prefetched (measured best among 128..768 with 2 threads).
constexpr int64_t kKc = 384;
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

#if defined(__AVX512F__)
constexpr bool kHaveKernel = true;

// Rows [0, MR) of C (row stride ldc) over the 64 columns of one panel and
// kc of its rows: C = A @ chunk (+ C when load_c) (+ bias when bias), with
// A [MR, kc] (row stride lda) and the chunk [kc, 64]. Only the first `ncols`
// columns of C are read or written (the last panel's tail). Each k step also
// prefetches `lines` cache lines from `pf` onwards into L2 (none when pf is
// null): the next chunk, so the memory stream runs while the tiles compute.
template <int MR>
void tile(const float* a, int64_t lda, const float* b, int64_t kc, const float* bias, int64_t ncols, float* c,
          int64_t ldc, bool load_c, const char* pf, int lines) {
  __mmask16 mask[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v)
    mask[v] = static_cast<__mmask16>((1u << std::clamp<int64_t>(ncols - 16 * v, 0, 16)) - 1u);
  __m512 acc[MR][kNv];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v)
      acc[i][v] = load_c ? _mm512_maskz_loadu_ps(mask[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    if (pf) {
      const char* p = pf + k * lines * 64;
      for (int l = 0; l < lines; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T1);
    }
    const float* bk = b + k * kNr;
    const __m512 b0 = _mm512_loadu_ps(bk), b1 = _mm512_loadu_ps(bk + 16), b2 = _mm512_loadu_ps(bk + 32),
                 b3 = _mm512_loadu_ps(bk + 48);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i * lda + k]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(ai, b2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(ai, b3, acc[i][3]);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) {
    if (!mask[v]) break;
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask[v], bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
      _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], bias ? _mm512_add_ps(acc[i][v], bv) : acc[i][v]);
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool,
                        const char*, int);
constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// C = or += x [M, K] @ panels [p0, p1) + bias. Per panel, chunk by chunk of
// kKc rows, every row tile passes over the chunk while it sits in L2; the
// tiles share out the prefetch of the next chunk (this panel's or the next
// panel's first), so the weights stream from memory while the FMAs run.
void panels(const float* x, int64_t M, int64_t K, int64_t N, const float* w, const float* bias, float* c,
            int64_t ldc, bool accumulate, int64_t p0, int64_t p1) {
  const int64_t tiles = (M + kMr - 1) / kMr;
  // Lines of the next chunk each tile prefetches per k step: a chunk row is
  // 4 lines, shared among up to 4 tiles. One row alone is a plain stream,
  // which the hardware prefetcher serves better without help (measured).
  const int lines = tiles >= 4 ? 1 : tiles >= 2 ? 2 : 4;
  const bool prefetch = M >= 2;
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = w + p * K * kNr;
    const int64_t col = p * kNr, ncols = std::min(kNr, N - col);
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = std::min(kKc, K - k0);
      const bool last = k0 + kc == K;
      const float* next = !last ? panel + (k0 + kc) * kNr : p + 1 < p1 ? panel + K * kNr : nullptr;
      const int64_t next_rows = !last ? std::min(kKc, K - k0 - kc) : std::min(kKc, K);
      for (int64_t i = 0, t = 0; i < M; i += kMr, ++t) {
        const char* pf = nullptr;
        if (prefetch && next) {
          // In cache lines of the next chunk; running past its end is harmless
          // (prefetches do not fault) and reaches what comes after it anyway.
          const int64_t first = t * kc * lines;
          if (first < next_rows * (kNr / 16)) pf = reinterpret_cast<const char*>(next) + first * 64;
        }
        const int64_t rows = std::min<int64_t>(kMr, M - i);
        kTiles[rows](x + i * K + k0, K, panel + k0 * kNr, kc, last && bias ? bias + col : nullptr, ncols,
                     c + i * ldc + col, ldc, accumulate || k0 > 0, pf, lines);
      }
    }
  }
}
#else
constexpr bool kHaveKernel = false;
#endif

// Uninitialised fp32 [P, K, 64]. From 2 MiB up, in 2 MiB-aligned memory
// advised for transparent huge pages: a decode step streams every weight
// once, and with 4 KiB pages that is a TLB miss every 16 panel rows.
torch::Tensor packed_buffer(int64_t P, int64_t K) {
  const size_t bytes = static_cast<size_t>(P * K * kNr) * sizeof(float);
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes < kHuge) return at::empty({P, K, kNr}, torch::kFloat32);
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* mem = std::aligned_alloc(kHuge, rounded);
  if (!mem) throw std::bad_alloc();
  madvise(mem, rounded, MADV_HUGEPAGE);  // advice only: without THP this is plain memory
  return at::from_blob(mem, {P, K, kNr}, [](void* m) { std::free(m); }, torch::TensorOptions().dtype(torch::kFloat32));
}

}  // namespace

Linear::Linear(const torch::Tensor& weight, WeightLayout layout, bool pack) : layout_(layout) {
  if (!weight.defined() || weight.dim() != 2) bad("Linear", "the weight must be a 2-D tensor");
  in_ = weight.size(layout == WeightLayout::kInOut ? 0 : 1);
  out_ = weight.size(layout == WeightLayout::kInOut ? 1 : 0);
  packed_ = kHaveKernel && pack && weight.device().is_cpu() && weight.scalar_type() == torch::kFloat32;
  if (!packed_) {
    weight_ = weight.contiguous();
    return;
  }
  // packed[p][k][j] = W[k][p * 64 + j], zero past the last column.
  const int64_t P = (out_ + kNr - 1) / kNr, K = in_, N = out_;
  weight_ = packed_buffer(P, K);
  float* dst = weight_.data_ptr<float>();
  const torch::Tensor src = weight.contiguous();
  const float* s = src.data_ptr<float>();
  const bool in_out = layout == WeightLayout::kInOut;
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t ncols = std::min(kNr, N - p * kNr);
      float* d = dst + p * K * kNr;
      if (ncols < kNr)
        for (int64_t k = 0; k < K; ++k) std::fill_n(d + k * kNr + ncols, kNr - ncols, 0.0f);
      if (in_out) {
        for (int64_t k = 0; k < K; ++k)
          std::copy_n(s + k * N + p * kNr, ncols, d + k * kNr);
      } else {
        for (int64_t j = 0; j < ncols; ++j) {
          const float* row = s + (p * kNr + j) * K;
          for (int64_t k = 0; k < K; ++k) d[k * kNr + j] = row[k];
        }
      }
    }
  });
}

torch::Device Linear::device() const { return weight_.defined() ? weight_.device() : torch::Device(torch::kCPU); }

void Linear::check_args(const torch::Tensor& x, const torch::Tensor& bias, const char* who) const {
  if (!weight_.defined()) bad(who, "this Linear holds no weight (default-constructed)");
  if (!x.defined() || x.dim() != 2 || x.size(1) != in_)
    bad(who, "x must be [M, in = " + std::to_string(in_) + "], got " + (x.defined() ? shape_str(x) : "undefined"));
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != out_))
    bad(who, "bias must be [out = " + std::to_string(out_) + "], got " + shape_str(bias));
  if (packed_) {
    auto fp32_cpu = [](const torch::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == torch::kFloat32; };
    if (!fp32_cpu(x) || (bias.defined() && !fp32_cpu(bias)))
      bad(who, "x and bias must be float32 CPU tensors like the packed weight; convert them with .to(torch::kFloat32)");
  }
}

void Linear::run_packed(const torch::Tensor& x_in, const torch::Tensor& bias_in, float* c, int64_t ldc,
                        bool accumulate) const {
#if defined(__AVX512F__)
  const torch::Tensor x = x_in.contiguous();
  const torch::Tensor bias = bias_in.defined() ? bias_in.contiguous() : bias_in;
  const int64_t M = x.size(0), K = in_, N = out_, P = weight_.size(0);
  if (M == 0) return;
  const float* xp = x.data_ptr<float>();
  const float* wp = weight_.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const int64_t per_panel = std::max<int64_t>(1, M * K * kNr);
  const int64_t grain = std::max<int64_t>(1, kMinFmaPerThread / per_panel);
  at::parallel_for(0, P, grain, [&](int64_t p0, int64_t p1) {
    panels(xp, M, K, N, wp, bp, c, ldc, accumulate, p0, p1);
  });
#else
  (void)x_in, (void)bias_in, (void)c, (void)ldc, (void)accumulate;
  throw std::logic_error("Linear: packed weight in a build without AVX-512");
#endif
}

torch::Tensor Linear::forward(const torch::Tensor& x, const torch::Tensor& bias) const {
  check_args(x, bias, "Linear::forward");
  if (packed_) {
    torch::Tensor y = at::empty({x.size(0), out_}, x.options());
    run_packed(x, bias, y.data_ptr<float>(), out_, /*accumulate=*/false);
    return y;
  }
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
  if (packed_) {
    if (!out.device().is_cpu() || out.scalar_type() != torch::kFloat32)
      bad(who, "out must be a float32 CPU tensor like the packed weight");
    if (out.is_contiguous()) run_packed(x, bias, out.data_ptr<float>(), out_, /*accumulate=*/true);
    else out.add_(forward(x, bias));
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
  if (!packed_) {
    const torch::Tensor idx = ids.to(weight_.device(), torch::kLong);
    return layout_ == WeightLayout::kOutIn ? weight_.index_select(0, idx) : weight_.index_select(1, idx).t().contiguous();
  }
  // Column n of W lies in panel n / 64 at lane n % 64, one float per 256 bytes.
  const torch::Tensor idx = ids.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t T = idx.size(0), K = in_;
  torch::Tensor e = at::empty({T, K}, weight_.options());
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    if (ip[t] < 0 || ip[t] >= out_)
      bad("Linear::embedding", "id " + std::to_string(ip[t]) + " is outside [0, out = " + std::to_string(out_) + ")");
  const float* wp = weight_.data_ptr<float>();
  float* ep = e.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* src = wp + (ip[t] / kNr) * K * kNr + ip[t] % kNr;
    for (int64_t k = 0; k < K; ++k) ep[t * K + k] = src[k * kNr];
  }
  return e;
}

}  // namespace troupe::model
