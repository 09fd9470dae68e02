// Linear's packed GEMMs for bfloat16 and int8 weights on AVX-512 BF16 and VNNI (compiled with
// -march=x86-64-v4 -mavx512bf16 -mavx512vnni; run only when the CPU has them,
// see cpu_features.hpp: Zen 4/5, Cooper Lake, Sapphire Rapids and later).
//
// vdpbf16ps multiplies pairs of bfloat16 and adds both products to an fp32
// lane: twice the multiply-adds of an fp32 FMA per instruction, so a step
// that is compute-bound (a decode of many sequences, a prefill) runs up to
// twice as fast as with the weights widened to fp32. The price: x is rounded
// to bfloat16 (to nearest, ties to even) on its way in, as llama.cpp's BF16
// dot products and a bf16 GPU GEMM do it. The same kernel serves every M,
// and each row of C depends only on its own row of x, so a sequence's logits
// do not depend on the batch it runs in.
//
// Panels of 64 columns as the AVX-512 fp32 kernel's, but each panel row holds
// a pair of K rows: panel p = [K2 = ceil(K / 2)][64][2] bfloat16, element
// (r, j, h) = W[2r + h][64p + j], zero past K and past column N
// (linear_kernel.hpp: PackedGemmKernel::pairs). One 64-byte load is 16 columns x 2 rows:
// the operand vdpbf16ps wants. x is rounded into [M][K2] pairs the same way,
// and one 32-bit broadcast feeds a row's pair to all 16 lanes.
//
// Tiles, chunks and prefetch are the fp32 kernel's (linear_avx512.cpp): 6 x
// 64 tiles of 24 accumulators, 192 pairs (384 K rows, 48 KiB of a panel) per
// chunk, the next chunk prefetched in equal shares while the tiles compute.
//
// int8 weights run on AVX-512 VNNI's vpdpwssd (16-bit pairs multiplied and
// summed into int32 lanes): each row of x is quantized to int16 with one
// scale, max |x| / 32767 (rounded to nearest; an error below 2^-16 of the
// row's largest value, so GPT-2's outlier features cost nothing like the
// 1/127 of int8 activations), the int8 weights, in pairs of K rows like the
// bfloat16 ones, are sign-extended to int16 in registers (one vpmovsxbw per
// 32 weights instead of two conversions per 16), and the sums are exact in
// int32 over a chunk of 384 K rows (|sum| <= 384 * 32767 * 127 < 2^31).
// Per channel: the chunk's int32 sums go to fp32 once, times x's row scale
// times the column's scale, into C (6 x 64 tiles). Groups of 32 (int8_g32):
// each group's int32 sums go to fp32 times the group's column scales into fp32
// accumulators, then times the row scale into C: two sets of accumulators, so
// tiles of 3 x 64. Every row depends on its own row of x only, for every M.
//
// Nothing here may be an inline function or template shared with other
// translation units: everything lives in namespace avx512bf16.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "model/cpu_features.hpp"
#include "model/linear_kernel.hpp"

namespace troupe::model::avx512bf16 {
namespace {

constexpr int64_t kNr = 64;
constexpr int kNv = 4;
constexpr int kMr = 6;
constexpr int64_t kKc2 = 192;  // pairs of K rows per chunk (384 rows, as the fp32 kernel's kKc)

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }
// A line of the next chunk: into L1 for a tile of one row on a CPU where that
// is faster (one_row_prefetch()), else into L2, where row tiles share it.
inline void prefetch_line(const char* p, bool l1) {
  if (l1)
    _mm_prefetch(p, _MM_HINT_T0);
  else
    _mm_prefetch(p, _MM_HINT_T1);
}

#include "model/vector_lanes.inc"

// A thread's scratch memory for x as the kernels read it: grows to the
// largest call's size, let go at the first call after release_kernel_scratch
// (linear.hpp), freed with the thread. (Not a std::vector: its member functions
// would be weak symbols compiled for this ISA, which the linker may hand to
// every other caller; cmake/check_kernel_isa.cmake checks.)
struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;
  uint64_t epoch = 0;
  void* get(size_t n) {
    if (const uint64_t e = kernel_scratch_epoch(); e != epoch) {
      std::free(p);
      p = nullptr;
      bytes = 0;
      epoch = e;
    }
    if (n > bytes) {
      std::free(p);
      p = std::malloc(n);
      bytes = p ? n : 0;
      if (!p) throw std::bad_alloc();
    }
    return p;
  }
  ~Scratch() { std::free(p); }
};
thread_local Scratch t_scratch;

// Row i of x [M, K] rounded to bfloat16 pairs: xb[i * K2 + r] holds x[i][2r]
// in its low half and x[i][2r + 1] (0 past K) in its high half.
void round_rows(const float* x, int64_t M, int64_t K, uint32_t* xb) {
  const int64_t K2 = (K + 1) / 2;
  for (int64_t i = 0; i < M; ++i) {
    const float* row = x + i * K;
    uint32_t* out = xb + i * K2;
    for (int64_t k = 0; k < K; k += 32) {
      const int64_t lo = clamp64(K - k, 0, 16), hi = clamp64(K - k - 16, 0, 16);
      const __m512 a = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << lo) - 1u), row + k);
      const __m512 b = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << hi) - 1u), row + k + 16);
      // The low 16 bfloat16 come from the second operand.
      const __m512i h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
      const int64_t pairs = (lo + hi + 1) / 2;
      _mm512_mask_storeu_epi32(out + k / 2, static_cast<__mmask16>((1u << pairs) - 1u), h);
    }
  }
}

// Rows [0, MR) of C over the 64 columns of one panel and kp pairs of its K
// rows: C = A @ chunk (+ C when load_c) (+ bias when bias), A as bfloat16
// pairs [MR, kp] (row stride lda pairs), the chunk [kp, 64, 2]. Only the first
// `ncols` columns of C are touched; `lines` cache lines from `pf` are
// prefetched, spread over the kp steps: into L2 where row tiles share the
// chunk; for a tile of one row (which reads each line once) into the level
// one_row_prefetch() gives this CPU (L1 on AMD: on Zen 5 48 batch-1 int8
// products ran 5-13% faster so than into L2, bf16's -2% to +7%; L2 on
// Intel: cpu_features.hpp); `gelu` on the last chunk.
template <int MR>
void tile(const uint32_t* a, int64_t lda, const uint16_t* b, int64_t kp, const float* bias, int64_t ncols,
          float* c, int64_t ldc, bool load_c, const char* pf, int64_t lines, bool gelu) {
  __mmask16 mask[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) mask[v] = static_cast<__mmask16>((1u << clamp64(ncols - 16 * v, 0, 16)) - 1u);
  __m512 acc[MR][kNv];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v)
      acc[i][v] = load_c ? _mm512_maskz_loadu_ps(mask[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
  int64_t due = 0;  // lines owed so far, times kp
  const bool l1 = MR == 1 && pf && one_row_prefetch() == CacheLevel::kL1;
  for (int64_t r = 0; r < kp; ++r) {
    if (pf) {
      for (due += lines; due >= kp; due -= kp, pf += 64) prefetch_line(pf, l1);
    }
    const uint16_t* br = b + r * kNr * 2;
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(br)),
                   b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(br + 32)),
                   b2 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(br + 64)),
                   b3 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(br + 96));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh ai = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[i * lda + r])));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
      acc[i][2] = _mm512_dpbf16_ps(acc[i][2], ai, b2);
      acc[i][3] = _mm512_dpbf16_ps(acc[i][3], ai, b3);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) {
    if (!mask[v]) break;
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask[v], bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 r = bias ? _mm512_add_ps(acc[i][v], bv) : acc[i][v];
      _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], gelu ? (__m512)gelu_tanh((Lanes)r) : r);
    }
  }
}

using TileFn = void (*)(const uint32_t*, int64_t, const uint16_t*, int64_t, const float*, int64_t, float*,
                        int64_t, bool, const char*, int64_t, bool);
constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// int8 weights (see the top): rows of a tile for groups of 32, whose tiles
// hold int32 and fp32 accumulators both.
constexpr int kMrGroups = 3;
constexpr int64_t kGroupPairs = kPackedGroupRows / 2;
static_assert(kKc2 % kGroupPairs == 0, "a chunk holds whole groups of int8_g32 rows");

// Row i of x [M, K] quantized to int16: xq as int16 [M][2 * K2] (zero past K),
// read as pairs; sx[i] = max |x[i]| / 32767 (0 for a row of zeros).
void quantize_rows(const float* x, int64_t M, int64_t K, uint32_t* xq, float* sx) {
  const int64_t K2 = (K + 1) / 2;
  for (int64_t i = 0; i < M; ++i) {
    const float* row = x + i * K;
    __m512 top = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 m = static_cast<__mmask16>((1u << clamp64(K - k, 0, 16)) - 1u);
      top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, row + k)));
    }
    const float largest = _mm512_reduce_max_ps(top);
    sx[i] = largest / 32767.0f;
    const __m512 inv = _mm512_set1_ps(largest > 0 ? 32767.0f / largest : 0.0f);
    auto* out = reinterpret_cast<int16_t*>(xq + i * K2);
    for (int64_t k = 0; k < 2 * K2; k += 16) {
      const __mmask16 m = static_cast<__mmask16>((1u << clamp64(K - k, 0, 16)) - 1u);
      // To nearest (MXCSR's default), saturated to int16.
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + k), inv));
      _mm256_mask_storeu_epi16(out + k, static_cast<__mmask16>((1u << clamp64(2 * K2 - k, 0, 16)) - 1u),
                               _mm512_cvtsepi32_epi16(q));
    }
  }
}

// 16 columns x 2 rows of a panel's pair row, sign-extended to int16.
inline __m512i pair_weights(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// acc[i][v] += rows [0, MR) of a (pair r) times pair row r of the chunk.
template <int MR>
inline void dot_pair_row(__m512i (&acc)[MR][kNv], const uint32_t* a, int64_t lda, const int8_t* br, int64_t r) {
  const __m512i w0 = pair_weights(br), w1 = pair_weights(br + 32), w2 = pair_weights(br + 64),
                w3 = pair_weights(br + 96);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const __m512i ai = _mm512_set1_epi32(static_cast<int>(a[i * lda + r]));
    acc[i][0] = _mm512_dpwssd_epi32(acc[i][0], ai, w0);
    acc[i][1] = _mm512_dpwssd_epi32(acc[i][1], ai, w1);
    acc[i][2] = _mm512_dpwssd_epi32(acc[i][2], ai, w2);
    acc[i][3] = _mm512_dpwssd_epi32(acc[i][3], ai, w3);
  }
}

// Rows [0, MR) of C over one panel's 64 columns and kp pairs of its K rows
// (int8 pairs [kp][64][2]), x as int16 pairs a (row stride lda pairs) with
// row scales sx. Per channel (G false): `scale` is the 64 columns' scales;
// C = (C when load_c) + (x.q) * sx * scale (+ bias). Groups (G): `scale` is
// the chunk's [kp / 16][64] group scales; C = (C when load_c) + sx * sum over
// the groups of (x.q over the group) * its scales (+ bias). `pf`, `lines`,
// `gelu`: as tile's.
template <int MR, bool G>
void tile_q8(const uint32_t* a, int64_t lda, const float* sx, const int8_t* b, int64_t kp, const float* scale,
             const float* bias, int64_t ncols, float* c, int64_t ldc, bool load_c, const char* pf, int64_t lines,
             bool gelu) {
  __mmask16 mask[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) mask[v] = static_cast<__mmask16>((1u << clamp64(ncols - 16 * v, 0, 16)) - 1u);
  __m512i acc[MR][kNv];
  __m512 sum[G ? MR : 1][kNv];  // groups: the scaled group sums so far
#pragma GCC unroll 8
  for (int i = 0; i < (G ? MR : 1); ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) sum[i][v] = _mm512_setzero_ps();
  int64_t due = 0;  // lines owed so far, times kp
  const bool l1 = MR == 1 && pf && one_row_prefetch() == CacheLevel::kL1;
  const int64_t step = G ? kGroupPairs : kp;
  for (int64_t g0 = 0; g0 < kp; g0 += step) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_si512();
    const int64_t g1 = min64(g0 + step, kp);
    for (int64_t r = g0; r < g1; ++r) {
      if (pf) {
        for (due += lines; due >= kp; due -= kp, pf += 64) prefetch_line(pf, l1);
      }
      dot_pair_row<MR>(acc, a, lda, b + r * kNr * 2, r);
    }
    if constexpr (G) {
      const float* gs = scale + g0 / kGroupPairs * kNr;
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) {
        const __m512 sv = _mm512_loadu_ps(gs + 16 * v);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) sum[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][v]), sv, sum[i][v]);
      }
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) {
    if (!mask[v]) break;
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask[v], bias + 16 * v) : _mm512_setzero_ps();
    const __m512 sv = G ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[v], scale + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      // Per channel: the sums times (row scale * column scale); groups: the
      // scaled sums times the row scale.
      const __m512 s = G ? _mm512_set1_ps(sx[i]) : _mm512_mul_ps(_mm512_set1_ps(sx[i]), sv);
      const __m512 d = G ? sum[i][v] : _mm512_cvtepi32_ps(acc[i][v]);
      __m512 r = load_c ? _mm512_fmadd_ps(d, s, _mm512_maskz_loadu_ps(mask[v], c + i * ldc + 16 * v))
                        : _mm512_mul_ps(d, s);
      r = bias ? _mm512_add_ps(r, bv) : r;
      _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], gelu ? (__m512)gelu_tanh((Lanes)r) : r);
    }
  }
}

using TileQ8Fn = void (*)(const uint32_t*, int64_t, const float*, const int8_t*, int64_t, const float*,
                          const float*, int64_t, float*, int64_t, bool, const char*, int64_t, bool);
template <bool G>
constexpr TileQ8Fn kTilesQ8[kMr + 1] = {nullptr,          tile_q8<1, G>, tile_q8<2, G>, tile_q8<3, G>,
                                        tile_q8<4, false>, tile_q8<5, false>, tile_q8<6, false>};

// The loop over panels, chunks of kKc2 pairs and tiles of up to mr rows
// that every kernel here shares (the fp32 kernel's, linear_avx512.cpp): per
// panel, chunk by chunk, every row tile passes over the chunk while it sits
// in L2, and the tiles prefetch the next chunk in equal shares, spread over
// their passes. One row prefetches too, unlike the fp32 kernel's: a batch-1
// step's int8 products ran 12-16% faster with the prefetches than on the
// hardware prefetcher alone, the whole step 4-17% (bf16: -1% to +12% and
// -1% to +10%; Zen 5, runs in random order); fp32's step was 4-8% slower
// with them, so linear_avx512.cpp keeps M >= 2.
// tile(i, rows, chunk, r0, kp, col, ncols, last, pf, lines)
// runs rows [i, i + rows) over pairs [r0, r0 + kp) of the panel at `chunk`.
template <typename W, typename Tile>
void for_each_tile(const W* w, int64_t M, int64_t K2, int64_t N, int64_t mr, int64_t p0, int64_t p1,
                   const Tile& tile) {
  constexpr int64_t kLines = kNr * 2 * static_cast<int64_t>(sizeof(W)) / 64;  // a pair row's cache lines
  const int64_t tiles = (M + mr - 1) / mr;
  for (int64_t p = p0; p < p1; ++p) {
    const W* panel = w + p * K2 * kNr * 2;
    const int64_t col = p * kNr, ncols = min64(kNr, N - col);
    for (int64_t r0 = 0; r0 < K2; r0 += kKc2) {
      const int64_t kp = min64(kKc2, K2 - r0);
      const bool last = r0 + kp == K2;
      const W* next = !last ? panel + (r0 + kp) * kNr * 2 : p + 1 < p1 ? panel + K2 * kNr * 2 : nullptr;
      const int64_t next_pairs = !last ? min64(kKc2, K2 - r0 - kp) : min64(kKc2, K2);
      const int64_t next_lines = next ? next_pairs * kLines : 0, share = (next_lines + tiles - 1) / tiles;
      for (int64_t i = 0, t = 0; i < M; i += mr, ++t) {
        const int64_t first = t * share, lines = min64(share, next_lines - first);
        const char* pf = lines > 0 ? reinterpret_cast<const char*>(next) + first * 64 : nullptr;
        tile(i, min64(mr, M - i), panel + r0 * kNr * 2, r0, kp, col, ncols, last, pf, lines);
      }
    }
  }
}

// The int8 GEMM on pairs (see the top); `scale`: per channel [N] padded to
// the panels, groups [P, ceil(K / 32), 64].
template <bool G>
void run_q8(const float* x, int64_t M, int64_t K, int64_t N, const int8_t* w, const float* scale,
            const float* bias, float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1) {
  const int64_t K2 = (K + 1) / 2, groups = (K + kPackedGroupRows - 1) / kPackedGroupRows;
  constexpr int64_t mr = G ? kMrGroups : kMr;
  // x as int16 pairs [M, K2], then the rows' scales [M].
  auto* xq = static_cast<uint32_t*>(t_scratch.get(static_cast<size_t>(M * K2 + M) * sizeof(uint32_t)));
  auto* sx = reinterpret_cast<float*>(xq + M * K2);
  quantize_rows(x, M, K, xq, sx);
  for_each_tile(w, M, K2, N, mr, p0, p1,
                [&](int64_t i, int64_t rows, const int8_t* chunk, int64_t r0, int64_t kp, int64_t col, int64_t ncols,
                    bool last, const char* pf, int64_t lines) {
                  const int64_t p = col / kNr;
                  const float* s = G ? scale + (p * groups + r0 / kGroupPairs) * kNr : scale + col;
                  kTilesQ8<G>[rows](xq + i * K2 + r0, K2, sx + i, chunk, kp, s, last && bias ? bias + col : nullptr,
                                    ncols, c + i * ldc + col, ldc, accumulate || r0 > 0, pf, lines, last && gelu);
                });
}

}  // namespace

void run_int8_pairs(const float* x, int64_t M, int64_t K, int64_t N, const int8_t* w, const float* scale,
                    const float* bias, float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1) {
  run_q8<false>(x, M, K, N, w, scale, bias, c, ldc, accumulate, gelu, p0, p1);
}

void run_int8_g32_pairs(const float* x, int64_t M, int64_t K, int64_t N, const int8_t* w,
                        const float* group_scale, const float* bias, float* c, int64_t ldc, bool accumulate,
                        bool gelu, int64_t p0, int64_t p1) {
  run_q8<true>(x, M, K, N, w, group_scale, bias, c, ldc, accumulate, gelu, p0, p1);
}

void run_bf16_pairs(const float* x, int64_t M, int64_t K, int64_t N, const uint16_t* w, const float* bias,
                    float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1) {
  const int64_t K2 = (K + 1) / 2;
  // Each thread rounds x for itself: M x K conversions beside M x K x 64
  // multiply-adds per panel, and no thread waits for another.
  auto* xb = static_cast<uint32_t*>(t_scratch.get(static_cast<size_t>(M * K2) * sizeof(uint32_t)));
  round_rows(x, M, K, xb);
  for_each_tile(w, M, K2, N, kMr, p0, p1,
                [&](int64_t i, int64_t rows, const uint16_t* chunk, int64_t r0, int64_t kp, int64_t col,
                    int64_t ncols, bool last, const char* pf, int64_t lines) {
                  kTiles[rows](xb + i * K2 + r0, K2, chunk, kp, last && bias ? bias + col : nullptr, ncols,
                               c + i * ldc + col, ldc, accumulate || r0 > 0, pf, lines, last && gelu);
                });
}

}  // namespace troupe::model::avx512bf16
