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
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_epi32() as the unused
// merge source of unmasked conversions and shifts, which -Wmaybe-uninitialized
// reports once they are inlined (load_w's bfloat16 widening): a false alarm.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <new>
#include <type_traits>

#include "model/cpu_features.hpp"
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
static_assert(kKc % kPackedGroupRows == 0, "a chunk holds whole groups of int8_g32 rows");

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// Lanes (one register: the same size as __m512, so a cast), exp_nonpositive
// and gelu_tanh, the GELU of the epilogue.
#include "model/vector_lanes.inc"

// Rows [0, MR) of C (row stride ldc) over the 64 columns of one panel and
// kc of its rows: C = A @ chunk (+ C when load_c) (+ bias when bias), with
// A [MR, kc] (row stride lda) and the chunk [kc, 64]. Only the first `ncols`
// columns of C are read or written (the last panel's tail). The tile also
// prefetches `lines` consecutive cache lines from `pf` (none when pf is
// null) into L2, a tile of one row into one_row_prefetch()'s level, spread
// evenly over its kc steps: its share of the next chunk, so the memory stream
// runs while the tiles compute, at an even pace.
// `gelu`: the stored values go through gelu_tanh (on the last chunk).
// int8 weights (W = int8_t): the accumulators start at 0 and hold this
// chunk's sums of a * q; the epilogue multiplies them by `scale` (the 64
// columns' scales) and adds C (when load_c) in one fused multiply-add, then
// the bias. Grouped int8 (G): `scale` is the chunk's [kc / 32, 64] group
// scales, each weight multiplied by its own when loaded, and the rest is
// fp32's. Other weights ignore `scale`.
//
// 16 weights of a panel row as fp32: loaded, widened from bfloat16 (its
// bits are the upper half of an fp32's: zero-extend, shift left 16), or
// from int8 (sign-extend to int32, convert: exact).
inline __m512 load_w(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_w(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load_w(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Vector v of a panel row's weights, times their group's scales (the row's
// 64 at gs) when G.
template <bool G, typename W>
inline __m512 weights(const W* row, const float* gs, int v) {
  if constexpr (G) return _mm512_mul_ps(load_w(row + 16 * v), _mm512_loadu_ps(gs + 16 * v));
  return load_w(row + 16 * v);
}

// kScaled: int8's per-channel epilogue (also for an int8 chunk already
// widened to fp32, W = float).
template <int MR, typename W, bool G, bool kScaled = std::is_same_v<W, int8_t> && !G>
void tile(const float* a, int64_t lda, const W* b, const float* scale, int64_t kc, const float* bias,
          int64_t ncols, float* c, int64_t ldc, bool load_c, const char* pf, int64_t lines, bool gelu) {
  __mmask16 mask[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) mask[v] = static_cast<__mmask16>((1u << clamp64(ncols - 16 * v, 0, 16)) - 1u);
  __m512 acc[MR][kNv];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v)
      acc[i][v] = load_c && !kScaled ? _mm512_maskz_loadu_ps(mask[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
  int64_t due = 0;  // lines owed so far, times kc
  const bool l1 = MR == 1 && pf && one_row_prefetch() == CacheLevel::kL1;
  for (int64_t k = 0; k < kc; ++k) {
    if (pf) {
      for (due += lines; due >= kc; due -= kc, pf += 64) {
        if (l1)
          _mm_prefetch(pf, _MM_HINT_T0);
        else
          _mm_prefetch(pf, _MM_HINT_T1);
      }
    }
    const W* bk = b + k * kNr;
    const float* gs = G ? scale + k / kPackedGroupRows * kNr : nullptr;
    const __m512 b0 = weights<G>(bk, gs, 0), b1 = weights<G>(bk, gs, 1), b2 = weights<G>(bk, gs, 2),
                 b3 = weights<G>(bk, gs, 3);
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
    const __m512 sv = kScaled ? _mm512_maskz_loadu_ps(mask[v], scale + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 r = acc[i][v];
      if constexpr (kScaled)
        r = load_c ? _mm512_fmadd_ps(r, sv, _mm512_maskz_loadu_ps(mask[v], c + i * ldc + 16 * v))
                   : _mm512_mul_ps(r, sv);
      r = bias ? _mm512_add_ps(r, bv) : r;
      _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], gelu ? (__m512)gelu_tanh((Lanes)r) : r);
    }
  }
}

template <typename W>
using TileFn = void (*)(const float*, int64_t, const W*, const float*, int64_t, const float*, int64_t, float*,
                        int64_t, bool, const char*, int64_t, bool);
template <typename W, bool G = false>
constexpr TileFn<W> kTiles[kMr + 1] = {nullptr,       tile<1, W, G>, tile<2, W, G>, tile<3, W, G>,
                                       tile<4, W, G>, tile<5, W, G>, tile<6, W, G>};

// fp32 weights with int8's per-channel epilogue: the tiles for an int8
// chunk widened once.
constexpr TileFn<float> kScaledTiles[kMr + 1] = {nullptr,
                                                 tile<1, float, false, true>,
                                                 tile<2, float, false, true>,
                                                 tile<3, float, false, true>,
                                                 tile<4, float, false, true>,
                                                 tile<5, float, false, true>,
                                                 tile<6, float, false, true>};

// This thread's buffer for one chunk of bfloat16 or int8 weights widened to
// fp32 (kKc x 64 floats, 96 KiB; kept for the thread's life).
float* widened_chunk() {
  struct Buffer {
    float* p = static_cast<float*>(::operator new[](sizeof(float) * kKc * kNr, std::align_val_t{64}));
    ~Buffer() { ::operator delete[](p, std::align_val_t{64}); }
  };
  thread_local Buffer b;
  return b.p;
}

// A chunk of kc panel rows [kc, 64] as fp32, each weight the value a tile
// widens it to in registers (weights<G>): bfloat16's bits shifted into an
// fp32's upper half, int8 converted (exact), with G times its group's scale
// (the chunk's group scales at gs).
template <typename W, bool G>
void widen_chunk(const W* src, const float* gs, int64_t kc, float* dst) {
  for (int64_t k = 0; k < kc; ++k) {
    const float* g = G ? gs + k / kPackedGroupRows * kNr : nullptr;
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) _mm512_storeu_ps(dst + k * kNr + 16 * v, weights<G>(src + k * kNr, g, v));
  }
}

// Per panel, chunk by chunk of kKc rows, every row tile passes over the chunk
// while it sits in L2; the tiles share out the prefetch of the next chunk
// (this panel's or the next panel's first) in equal parts, each spread over
// its own pass, so the weights stream from memory at an even pace while the
// FMAs run. (Handing the whole chunk to the first tiles at a line or two per
// k step instead, as before, sent the requests in bursts that stalled those
// tiles: on the Xeon, one thread, M = 64 ran ~10% slower that way.)
// `scale`: int8's per-column scales [N], or with G int8_g32's group scales
// [P, ceil(K / 32), 64] (else nullptr).
template <typename W, bool G = false>
void run(const float* x, int64_t M, int64_t K, int64_t N, const W* w, const float* scale, const float* bias,
         float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1) {
  const int64_t groups = (K + kPackedGroupRows - 1) / kPackedGroupRows;
  constexpr int64_t kLinesPerRow = kNr * static_cast<int64_t>(sizeof(W)) / 64;  // 4 fp32, 2 bfloat16, 1 int8
  const int64_t tiles = (M + kMr - 1) / kMr;
  // One row of fp32 weights is a plain stream, which the hardware prefetcher
  // serves better without help (measured: Zen 5 4-8%, Xeon 3-4% slower with
  // it). Widened int8 weights cost more instructions per line, and the
  // hardware alone kept too few lines in flight: one row prefetches into
  // one_row_prefetch()'s level (batch-1 step, prefetch off / on in one
  // process: Zen 5 into L1 1.13x, into L2 1.17x faster; Xeon Emerald Rapids
  // against its floor 2.11-2.22x -> 1.28-1.54x into L2). bfloat16 only where
  // that level is L2: on the Xeon its step went 1.63-1.69x -> 1.19-1.24x its
  // floor (1.53-1.56x into L1), on Zen 5 it ran 6-11% slower with a prefetch
  // into either level than with the hardware's alone.
  const bool prefetch = M >= 2 || std::is_same_v<W, int8_t> ||
                        (std::is_same_v<W, uint16_t> && one_row_prefetch() == CacheLevel::kL2);
  // bfloat16 and int8 weights for two row tiles or more: each chunk widened
  // once into fp32 in a buffer that stays in L2, then fp32's tiles over it
  // (int8 per channel: with its epilogue): the same FMAs on the same values
  // in the same order (the same bits as widening in registers), without a
  // widening per tile. On a CPU whose FMA ports also widen (Xeon Emerald
  // Rapids) that was a quarter of a tile's instructions or more.
  [[maybe_unused]] float* widened = nullptr;
  if constexpr (!std::is_same_v<W, float>) {
    if (tiles >= 2) widened = widened_chunk();
  }
  for (int64_t p = p0; p < p1; ++p) {
    const W* panel = w + p * K * kNr;
    const int64_t col = p * kNr, ncols = min64(kNr, N - col);
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = min64(kKc, K - k0);
      const bool last = k0 + kc == K;
      const W* next = !last ? panel + (k0 + kc) * kNr : p + 1 < p1 ? panel + K * kNr : nullptr;
      const int64_t next_rows = !last ? min64(kKc, K - k0 - kc) : min64(kKc, K);
      // The next chunk in cache lines, an equal share per tile.
      const int64_t next_lines = next ? next_rows * kLinesPerRow : 0, share = (next_lines + tiles - 1) / tiles;
      const float* s = !scale ? nullptr
                       : G    ? scale + (p * groups + k0 / kPackedGroupRows) * kNr
                              : scale + col;
      constexpr bool kScaled = std::is_same_v<W, int8_t> && !G;
      if constexpr (!std::is_same_v<W, float>) {
        if (widened) widen_chunk<W, G>(panel + k0 * kNr, s, kc, widened);
      }
      for (int64_t i = 0, t = 0; i < M; i += kMr, ++t) {
        const int64_t first = t * share, lines = prefetch ? min64(share, next_lines - first) : 0;
        const char* pf = lines > 0 ? reinterpret_cast<const char*>(next) + first * 64 : nullptr;
        const int64_t rows = min64(kMr, M - i);
        if constexpr (!std::is_same_v<W, float>) {
          if (widened) {
            (kScaled ? kScaledTiles : kTiles<float, false>)[rows](
                x + i * K + k0, K, widened, kScaled ? s : nullptr, kc, last && bias ? bias + col : nullptr,
                ncols, c + i * ldc + col, ldc, accumulate || k0 > 0, pf, lines, last && gelu);
            continue;
          }
        }
        kTiles<W, G>[rows](x + i * K + k0, K, panel + k0 * kNr, s, kc, last && bias ? bias + col : nullptr,
                           ncols, c + i * ldc + col, ldc, accumulate || k0 > 0, pf, lines, last && gelu);
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

}  // namespace troupe::model::avx512

namespace troupe::model::avx512bf16 {

// The fp32 kernel above; bfloat16 and int8 weights on vdpbf16ps and vpdpwssd
// (linear_avx512bf16.cpp).
const PackedGemmKernel kPackedGemm = {avx512::kNr,        avx512::run_unscaled<float>, run_bf16_pairs,
                                      run_int8_pairs,     run_int8_g32_pairs,          /*bf16_pairs=*/true,
                                      /*int8_pairs=*/true};
const PackedGemmKernel kPackedGemmWidenedBf16 = {
    avx512::kNr,          avx512::run_unscaled<float>, avx512::run_unscaled<uint16_t>,
    run_int8_pairs,       run_int8_g32_pairs,
    /*bf16_pairs=*/false, /*int8_pairs=*/true};

}  // namespace troupe::model::avx512bf16
