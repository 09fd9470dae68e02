// Linear's packed GEMM for AVX-512 (compiled with -march=x86-64-v4; run only
// when the CPU has it, see cpu_features.hpp).
//
// Panels of 64 columns (4 zmm). Tiles of up to 6 rows x 64 columns keep 24
// accumulators in zmm registers; all row tiles pass over a 384-row chunk of a
// panel while it sits in L2 and prefetch the next chunk meanwhile, so each
// weight comes from memory once per call and the stream overlaps the FMAs
// (Goto & van de Geijn, "Anatomy of high-performance matrix multiplication",
// 2008, with the packed panel in the role of B).
//
// Nothing here may be an inline function or template shared with other
// translation units (the linker would keep one copy, maybe this one, for
// every caller): everything lives in namespace avx512.
#include <immintrin.h>

#include <cstdint>

#include "model/linear_kernel.hpp"

namespace troupe::model::avx512 {
namespace {

constexpr int64_t kNr = 64;  // columns per packed panel: 4 zmm vectors
constexpr int kNv = 4;
constexpr int kMr = 6;  // rows per tile: 6 x 4 = 24 accumulators of the 32 zmm registers
// Rows of a panel that every row tile consumes before the next chunk: 384 x
// 256 B = 96 KiB, so the chunk stays in L2 while all tiles pass over it and
// the next one is prefetched (measured best among 128..768 with 2 threads).
constexpr int64_t kKc = 384;

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// GPT-2's tanh GELU, 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715
// x^3), as x * sigmoid(2u) (the same function: 0.5 (1 + tanh(u)) = 1 / (1 +
// e^-2u)), through t = e^-|2u| in (0, 1] so no exp overflows: sigmoid(2u) =
// (2u >= 0 ? 1 : t) / (1 + t). The exp is Cephes' expf polynomial (~1 ulp);
// the result is within a few ulp of the exact GELU (at::gelu(x, "tanh")
// loses the far negative tail: 1 + tanh(u) cancels), NaN for a NaN x.
// (The maskz_ forms with every lane set: GCC 12 warns that the plain forms'
// _mm512_undefined_ps source "may be used uninitialized".)
inline __m512 gelu_tanh(__m512 x) {
  constexpr __mmask16 kAll = 0xffff;
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 two_u = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.5957691216057308f)),  // 2 sqrt(2/pi)
                                     _mm512_fmadd_ps(x2, _mm512_set1_ps(0.044715f), _mm512_set1_ps(1.0f)));
  // a = -|2u| clamped into [-87, 0]; t = 0 below -87 (and for a NaN x, whose
  // result x * 0 is NaN): the clamped exp would leave e^-87 ~ 1.6e-38, which
  // times a huge negative x is not ~0.
  const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(two_u));
  const __mmask16 in_range = _mm512_cmp_ps_mask(neg, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  const __m512 a = _mm512_maskz_max_ps(kAll, neg, _mm512_set1_ps(-87.0f));
  const __m512 fx = _mm512_maskz_roundscale_ps(kAll, _mm512_mul_ps(a, _mm512_set1_ps(1.44269504088896341f)),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), a);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i pow2 = _mm512_maskz_slli_epi32(
      kAll, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(kAll, fx), _mm512_set1_epi32(127)), 23);
  const __m512 t = _mm512_maskz_mul_ps(in_range, y, _mm512_castsi512_ps(pow2));
  const __mmask16 pos = _mm512_cmp_ps_mask(two_u, _mm512_setzero_ps(), _CMP_GE_OQ);
  const __m512 num = _mm512_mask_blend_ps(pos, t, _mm512_set1_ps(1.0f));
  return _mm512_mul_ps(x, _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), t)));
}

// Rows [0, MR) of C (row stride ldc) over the 64 columns of one panel and
// kc of its rows: C = A @ chunk (+ C when load_c) (+ bias when bias), with
// A [MR, kc] (row stride lda) and the chunk [kc, 64]. Only the first `ncols`
// columns of C are read or written (the last panel's tail). Each k step also
// prefetches `lines` cache lines from `pf` onwards into L2 (none when pf is
// null): the next chunk, so the memory stream runs while the tiles compute.
// `gelu`: the stored values go through gelu_tanh (on the last chunk).
template <int MR>
void tile(const float* a, int64_t lda, const float* b, int64_t kc, const float* bias, int64_t ncols, float* c,
          int64_t ldc, bool load_c, const char* pf, int lines, bool gelu) {
  __mmask16 mask[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) mask[v] = static_cast<__mmask16>((1u << clamp64(ncols - 16 * v, 0, 16)) - 1u);
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
    for (int i = 0; i < MR; ++i) {
      const __m512 r = bias ? _mm512_add_ps(acc[i][v], bv) : acc[i][v];
      _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], gelu ? gelu_tanh(r) : r);
    }
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t,
                        bool, const char*, int, bool);
constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// Per panel, chunk by chunk of kKc rows, every row tile passes over the chunk
// while it sits in L2; the tiles share out the prefetch of the next chunk
// (this panel's or the next panel's first), so the weights stream from
// memory while the FMAs run.
void run(const float* x, int64_t M, int64_t K, int64_t N, const float* w, const float* bias, float* c,
         int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1) {
  const int64_t tiles = (M + kMr - 1) / kMr;
  // Lines of the next chunk each tile prefetches per k step: a chunk row is
  // 4 lines, shared among up to 4 tiles. One row alone is a plain stream,
  // which the hardware prefetcher serves better without help (measured).
  const int lines = tiles >= 4 ? 1 : tiles >= 2 ? 2 : 4;
  const bool prefetch = M >= 2;
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = w + p * K * kNr;
    const int64_t col = p * kNr, ncols = min64(kNr, N - col);
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = min64(kKc, K - k0);
      const bool last = k0 + kc == K;
      const float* next = !last ? panel + (k0 + kc) * kNr : p + 1 < p1 ? panel + K * kNr : nullptr;
      const int64_t next_rows = !last ? min64(kKc, K - k0 - kc) : min64(kKc, K);
      for (int64_t i = 0, t = 0; i < M; i += kMr, ++t) {
        const char* pf = nullptr;
        if (prefetch && next) {
          // In cache lines of the next chunk; running past its end is harmless
          // (prefetches do not fault) and reaches what comes after it anyway.
          const int64_t first = t * kc * lines;
          if (first < next_rows * (kNr / 16)) pf = reinterpret_cast<const char*>(next) + first * 64;
        }
        const int64_t rows = min64(kMr, M - i);
        kTiles[rows](x + i * K + k0, K, panel + k0 * kNr, kc, last && bias ? bias + col : nullptr, ncols,
                     c + i * ldc + col, ldc, accumulate || k0 > 0, pf, lines, last && gelu);
      }
    }
  }
}

}  // namespace

const PackedGemmKernel kPackedGemm = {kNr, run};

}  // namespace troupe::model::avx512
