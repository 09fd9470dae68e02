// FMA-peak and streaming-read loops with AVX-512 (flags from CMakeLists.txt).
#include <immintrin.h>

#include "machine_limits_kernels.hpp"

namespace troupe::bench::avx512 {
namespace {

// 16 independent chains: 2 FMA pipes x 4-cycle latency need 8; 16 leaves
// room for a 512-bit pipe that issues one per cycle with latency up to 8.
constexpr int kChains = 16;

double fma(int64_t iters) {
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(1.0f + 0.001f * j);
  const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_fmadd_ps(acc[j], b, c);
  __m512 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, acc[j]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  volatile float sink = out[0] + out[15];
  (void)sink;
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}

float read(const float* x, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float s = 0;
  for (float v : out) s += v;
  for (; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

const LimitLoops kLimitLoops = {fma, read};

}  // namespace troupe::bench::avx512
