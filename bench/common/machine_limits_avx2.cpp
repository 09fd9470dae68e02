// FMA-peak and streaming-read loops with AVX2 + FMA (flags from CMakeLists.txt).
#include <immintrin.h>

#include "machine_limits_kernels.hpp"

namespace troupe::bench::avx2 {
namespace {

// 12 independent chains of the 16 ymm registers: 2 FMA pipes x 4-5 cycles
// of latency need 8-10.
constexpr int kChains = 12;

double fma(int64_t iters) {
  __m256 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_ps(1.0f + 0.001f * j);
  const __m256 b = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], b, c);
  __m256 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_ps(s, acc[j]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  volatile float sink = out[0] + out[7];
  (void)sink;
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}

float read(const float* x, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float v : out) s += v;
  for (; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

const LimitLoops kLimitLoops = {fma, read};

}  // namespace troupe::bench::avx2
