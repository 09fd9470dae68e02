// Linear's packed GEMM for AVX2 + FMA (compiled with -march=x86-64-v3; run
// only when the CPU has it, see cpu_features.hpp).
//
// 16 ymm registers: a 6 x 16 tile (BLIS's Haswell sgemm shape) holds 12
// accumulators, 2 weight vectors and 1 broadcast. Panels are 16 columns, so a
// panel row is one 64-byte cache line. Loop nest (Goto & van de Geijn,
// "Anatomy of high-performance matrix multiplication", 2008):
//
//   for each block of kMc rows of x        (x's [kMc, kKc] chunk stays in L2)
//     for each chunk of kKc rows of K
//       for each panel p in [p0, p1)        (the panel's [kKc, 16] chunk, 16 KiB, stays in L1)
//         for each tile of 6 rows           (12 FMAs per 2 weight loads and 6 broadcasts)
//
// while the tiles prefetch the next panel's chunk, an equal share each, so
// weights stream from memory under the FMAs at an even pace. Up to 6 rows
// (one tile, no reuse) each panel is one stream from top to bottom instead.
// With one or two rows a tile would be a chain of 2 or 4 dependent FMAs per k
// (latency-bound): those tiles split k over 4 or 2 accumulator sets (8
// independent chains), summed at the end.
//
// Nothing here may be an inline function or template shared with other
// translation units (the linker would keep one copy, maybe this one, for
// every caller): everything lives in namespace avx2.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "model/cpu_features.hpp"
#include "model/linear_kernel.hpp"

namespace troupe::model::avx2 {
namespace {

constexpr int64_t kNr = 16;  // columns per packed panel: 2 ymm vectors
constexpr int kMr = 6;
// A chunk of a panel, 256 x 64 B = 16 KiB, and a tile's 6 x 256 floats of x
// (6 KiB) fit a 32 KiB L1 together.
constexpr int64_t kKc = 256;
static_assert(kKc % kPackedGroupRows == 0, "a chunk holds whole groups of int8_g32 rows");
// x rows per block: [96, 256] fp32 = 96 KiB of x stays in L2 (512 KiB and
// up) while every panel of the thread passes; each chunk of the weights is
// read once per block.
constexpr int64_t kMc = 96;

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Lanes (one register: the same size as __m256, so a cast), exp_nonpositive
// and gelu_tanh, the GELU of the epilogue.
#include "model/vector_lanes.inc"

// C rows [0, MR) x 16 columns of one panel (only the first ncols exist) =
// (load_c ? C : 0) + A [MR, kc] (row stride lda) @ chunk [kc, 16] (+ bias).
// KS: accumulator sets, k split KS ways. The tile also prefetches `lines`
// consecutive lines from pf into L2, or into L1 when pf_l1 (none when pf is
// null), spread evenly over its kc / KS steps. `gelu`: the stored values go
// through gelu_tanh (on the last chunk). int8 weights (W = int8_t): the accumulators start at 0 and
// hold this chunk's sums of a * q; the epilogue multiplies them by `scale`
// (the 16 columns' scales) and adds C (when load_c) in one fused
// multiply-add, then the bias. Grouped int8 (G): `scale` is the chunk's
// [kc / 32, 16] group scales, each weight multiplied by its own when loaded,
// and the rest is fp32's. Other weights ignore `scale`.
//
// 8 weights of a panel row as fp32: loaded, widened from bfloat16 (its bits
// are the upper half of an fp32's: zero-extend, shift left 16), or from int8
// (sign-extend to int32, convert: exact).
inline __m256 load_w(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_w(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load_w(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Vector v of panel row k's weights, times their group's scales when G
// (`scale`: the tile's group scales, 16 per group).
template <bool G, typename W>
inline __m256 weights(const W* b, const float* scale, int64_t k, int v) {
  if constexpr (G)
    return _mm256_mul_ps(load_w(b + k * kNr + 8 * v), _mm256_loadu_ps(scale + k / kPackedGroupRows * kNr + 8 * v));
  return load_w(b + k * kNr + 8 * v);
}

// kScaled: int8's per-channel epilogue (also for an int8 chunk already
// widened to fp32, W = float).
template <int MR, int KS, typename W, bool G, bool kScaled = std::is_same_v<W, int8_t> && !G>
void tile(const float* a, int64_t lda, const W* b, const float* scale, int64_t kc, const float* bias,
          int64_t ncols, float* c, int64_t ldc, bool load_c, const char* pf, int64_t lines, bool pf_l1,
          bool gelu) {
  const bool full = ncols == kNr;
  const __m256i n = _mm256_set1_epi32(static_cast<int>(ncols));
  const __m256i m0 = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i m1 = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
  __m256 acc[KS][MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (load_c && !kScaled) {
      acc[0][i][0] = full ? _mm256_loadu_ps(c + i * ldc) : _mm256_maskload_ps(c + i * ldc, m0);
      acc[0][i][1] = full ? _mm256_loadu_ps(c + i * ldc + 8) : _mm256_maskload_ps(c + i * ldc + 8, m1);
    } else {
      acc[0][i][0] = acc[0][i][1] = _mm256_setzero_ps();
    }
#pragma GCC unroll 4
    for (int s = 1; s < KS; ++s) acc[s][i][0] = acc[s][i][1] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  const int64_t steps = kc / KS;
  int64_t due = 0;  // lines owed so far, times steps
  for (; k + KS <= kc; k += KS) {
    if (pf) {
      for (due += lines; due >= steps; due -= steps, pf += 64) {
        if (pf_l1)
          _mm_prefetch(pf, _MM_HINT_T0);
        else
          _mm_prefetch(pf, _MM_HINT_T1);
      }
    }
#pragma GCC unroll 4
    for (int s = 0; s < KS; ++s) {
      const __m256 b0 = weights<G>(b, scale, k + s, 0), b1 = weights<G>(b, scale, k + s, 1);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m256 ai = _mm256_broadcast_ss(a + i * lda + k + s);
        acc[s][i][0] = _mm256_fmadd_ps(ai, b0, acc[s][i][0]);
        acc[s][i][1] = _mm256_fmadd_ps(ai, b1, acc[s][i][1]);
      }
    }
  }
  for (; k < kc; ++k) {
    const __m256 b0 = weights<G>(b, scale, k, 0), b1 = weights<G>(b, scale, k, 1);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i * lda + k);
      acc[0][i][0] = _mm256_fmadd_ps(ai, b0, acc[0][i][0]);
      acc[0][i][1] = _mm256_fmadd_ps(ai, b1, acc[0][i][1]);
    }
  }
  const __m256 bias0 =
      bias ? (full ? _mm256_loadu_ps(bias) : _mm256_maskload_ps(bias, m0)) : _mm256_setzero_ps();
  const __m256 bias1 =
      bias ? (full ? _mm256_loadu_ps(bias + 8) : _mm256_maskload_ps(bias + 8, m1)) : _mm256_setzero_ps();
  __m256 scale0 = _mm256_setzero_ps(), scale1 = _mm256_setzero_ps();
  if constexpr (kScaled) {
    scale0 = full ? _mm256_loadu_ps(scale) : _mm256_maskload_ps(scale, m0);
    scale1 = full ? _mm256_loadu_ps(scale + 8) : _mm256_maskload_ps(scale + 8, m1);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    __m256 r0 = acc[0][i][0], r1 = acc[0][i][1];
#pragma GCC unroll 4
    for (int s = 1; s < KS; ++s) {
      r0 = _mm256_add_ps(r0, acc[s][i][0]);
      r1 = _mm256_add_ps(r1, acc[s][i][1]);
    }
    if constexpr (kScaled) {
      if (load_c) {
        r0 = _mm256_fmadd_ps(r0, scale0, full ? _mm256_loadu_ps(c + i * ldc) : _mm256_maskload_ps(c + i * ldc, m0));
        r1 = _mm256_fmadd_ps(r1, scale1,
                             full ? _mm256_loadu_ps(c + i * ldc + 8) : _mm256_maskload_ps(c + i * ldc + 8, m1));
      } else {
        r0 = _mm256_mul_ps(r0, scale0);
        r1 = _mm256_mul_ps(r1, scale1);
      }
    }
    if (bias) {
      r0 = _mm256_add_ps(r0, bias0);
      r1 = _mm256_add_ps(r1, bias1);
    }
    if (gelu) {
      r0 = (__m256)gelu_tanh((Lanes)r0);
      r1 = (__m256)gelu_tanh((Lanes)r1);
    }
    if (full) {
      _mm256_storeu_ps(c + i * ldc, r0);
      _mm256_storeu_ps(c + i * ldc + 8, r1);
    } else {
      _mm256_maskstore_ps(c + i * ldc, m0, r0);
      _mm256_maskstore_ps(c + i * ldc + 8, m1, r1);
    }
  }
}

template <typename W>
using TileFn = void (*)(const float*, int64_t, const W*, const float*, int64_t, const float*, int64_t, float*,
                        int64_t, bool, const char*, int64_t, bool, bool);
template <typename W, bool G = false>
constexpr TileFn<W> kTiles[kMr + 1] = {nullptr,          tile<1, 4, W, G>, tile<2, 2, W, G>, tile<3, 1, W, G>,
                                       tile<4, 1, W, G>, tile<5, 1, W, G>, tile<6, 1, W, G>};
constexpr int kSplit[kMr + 1] = {1, 4, 2, 1, 1, 1, 1};
// fp32 weights with int8's per-channel epilogue: the tiles for an int8
// chunk widened once.
constexpr TileFn<float> kScaledTiles[kMr + 1] = {nullptr,
                                                 tile<1, 4, float, false, true>,
                                                 tile<2, 2, float, false, true>,
                                                 tile<3, 1, float, false, true>,
                                                 tile<4, 1, float, false, true>,
                                                 tile<5, 1, float, false, true>,
                                                 tile<6, 1, float, false, true>};

// This thread's buffer for one chunk of bfloat16 or int8 weights widened to
// fp32 (kKc x 16 floats, 16 KiB: it stays in L1; kept for the thread's life).
float* widened_chunk() {
  alignas(64) thread_local float buffer[kKc * kNr];
  return buffer;
}

// A chunk of kc panel rows [kc, 16] as fp32, each weight the value a tile
// widens it to in registers (weights<G>; `scale`: the chunk's group scales).
template <typename W, bool G>
void widen_chunk(const W* chunk, const float* scale, int64_t kc, float* dst) {
  for (int64_t k = 0; k < kc; ++k) {
    _mm256_storeu_ps(dst + k * kNr, weights<G>(chunk, scale, k, 0));
    _mm256_storeu_ps(dst + k * kNr + 8, weights<G>(chunk, scale, k, 1));
  }
}

// `scale`: int8's per-column scales [N], or with G int8_g32's group scales
// [P, ceil(K / 32), 16] (else nullptr).
template <typename W, bool G = false>
void run(const float* x, int64_t M, int64_t K, int64_t N, const W* w, const float* scale, const float* bias,
         float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1) {
  const int64_t groups = (K + kPackedGroupRows - 1) / kPackedGroupRows;
  // The scales of panel p's rows from k0 on.
  auto tile_scale = [&](int64_t p, int64_t k0) -> const float* {
    if (!scale) return nullptr;
    return G ? scale + (p * groups + k0 / kPackedGroupRows) * kNr : scale + p * kNr;
  };
  if (M <= kMr) {
    // One tile: no weight is reused, so no chunking either; each panel is
    // one contiguous stream, and the tile prefetches the next panel (the
    // next K x 16 weights in memory) spread over its pass, into the level
    // one_row_prefetch() gives this CPU. The hardware prefetcher alone kept
    // too few lines in flight under the widening of int8 everywhere (batch-1
    // step: Xeon Emerald Rapids against its floor int8 2.39-2.45x ->
    // 1.35-1.53x, int8_g32 2.39-2.44x -> 1.56-1.61x; Zen 5, off / on in one
    // process, into L1: 1.03-1.05x, 0.96-1.01x), and on the Xeon under
    // bfloat16's and fp32's too (bf16 1.83-1.88x -> 1.23-1.24x, fp32
    // 1.26-1.29x -> 1.12x). On Zen 5 bfloat16 ran 5-15% slower with a prefetch
    // into L1 and the same into L2: bfloat16 and fp32 prefetch only where
    // the level is L2 (Intel's) and leave L1's CPUs to the hardware prefetcher.
    const CacheLevel level = one_row_prefetch();
    const bool prefetch = std::is_same_v<W, int8_t> || level == CacheLevel::kL2;
    const int64_t lines = prefetch ? (K * kNr * static_cast<int64_t>(sizeof(W)) + 63) / 64 : 0;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t col = p * kNr;
      const char* next =
          prefetch && p + 1 < p1 ? reinterpret_cast<const char*>(w + (p + 1) * K * kNr) : nullptr;
      kTiles<W, G>[M](x, K, w + p * K * kNr, tile_scale(p, 0), K, bias ? bias + col : nullptr,
                      min64(kNr, N - col), c + col, ldc, accumulate, next, next ? lines : 0,
                      level == CacheLevel::kL1, gelu);
    }
    return;
  }
  for (int64_t m0 = 0; m0 < M; m0 += kMc) {
    const int64_t mc = min64(kMc, M - m0);
    const int64_t tiles = (mc + kMr - 1) / kMr;
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = min64(kKc, K - k0);
      const bool last = k0 + kc == K;
      for (int64_t p = p0; p < p1; ++p) {
        const W* chunk = w + (p * K + k0) * kNr;
        // The chunk after this one: the next panel's, else the first panel's next chunk.
        const W* next = nullptr;
        int64_t next_rows = 0;
        if (p + 1 < p1) {
          next = chunk + K * kNr;
          next_rows = kc;
        } else if (!last) {
          next = w + (p0 * K + k0 + kc) * kNr;
          next_rows = min64(kKc, K - k0 - kc);
        }
        const int64_t col = p * kNr, ncols = min64(kNr, N - col);
        // Tiles share out the next chunk's lines (one per panel row of fp32,
        // one per two of bfloat16, per four of int8) in equal parts, each
        // spread over the tile's pass (see avx512's run()).
        const int64_t next_lines = (next_rows * kNr * static_cast<int64_t>(sizeof(W)) + 63) / 64;
        const int64_t share = (next_lines + tiles - 1) / tiles;
        // bfloat16 and int8 for two row tiles or more: the chunk widened once
        // (into L1), then fp32's tiles (int8 per channel: with its epilogue):
        // the same FMAs on the same values in the same order, so the same
        // bits as widening in every tile's registers (avx512's run()).
        [[maybe_unused]] const float* widened = nullptr;
        constexpr bool kScaled = std::is_same_v<W, int8_t> && !G;
        if constexpr (!std::is_same_v<W, float>) {
          if (tiles >= 2) {
            float* buffer = widened_chunk();
            widen_chunk<W, G>(chunk, tile_scale(p, k0), kc, buffer);
            widened = buffer;
          }
        }
        for (int64_t i = 0, t = 0; i < mc; i += kMr, ++t) {
          const int64_t rows = min64(kMr, mc - i);
          const int64_t first = t * share,
                        lines = next && kc >= kSplit[rows] ? min64(share, next_lines - first) : 0;
          const char* pf = lines > 0 ? reinterpret_cast<const char*>(next) + first * 64 : nullptr;
          if constexpr (!std::is_same_v<W, float>) {
            if (widened) {
              (kScaled ? kScaledTiles : kTiles<float, false>)[rows](
                  x + (m0 + i) * K + k0, K, widened, kScaled ? tile_scale(p, k0) : nullptr, kc,
                  last && bias ? bias + col : nullptr, ncols, c + (m0 + i) * ldc + col, ldc,
                  accumulate || k0 > 0, pf, lines, false, last && gelu);
              continue;
            }
          }
          kTiles<W, G>[rows](x + (m0 + i) * K + k0, K, chunk, tile_scale(p, k0), kc,
                             last && bias ? bias + col : nullptr, ncols, c + (m0 + i) * ldc + col, ldc,
                             accumulate || k0 > 0, pf, lines, false, last && gelu);
        }
      }
    }
  }
}

template <typename W>
void run_unscaled(const float* x, int64_t M, int64_t K, int64_t N, const W* w, const float* bias, float* c,
                  int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1) {
  run<W>(x, M, K, N, w, nullptr, bias, c, ldc, accumulate, gelu, p0, p1);
}

}  // namespace

const PackedGemmKernel kPackedGemm = {kNr, run_unscaled<float>, run_unscaled<uint16_t>, run<int8_t>,
                                      run<int8_t, true>};

}  // namespace troupe::model::avx2
