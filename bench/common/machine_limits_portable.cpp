// Multiply-add peak and streaming-read loops with SSE (x86-64-v2 has no FMA:
// a multiply and an add per step; flags from CMakeLists.txt).
#include <immintrin.h>

#include "machine_limits_kernels.hpp"

namespace troupe::bench::portable {
namespace {

// 14 independent chains (of 16 xmm registers; 2 hold the constants): a
// multiply then an add, ~7 cycles of latency, on 2 multiply + 2 add pipes.
constexpr int kChains = 14;

double fma(int64_t iters) {
  __m128 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm_set1_ps(1.0f + 0.001f * j);
  const __m128 b = _mm_set1_ps(0.9999999f), c = _mm_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 14
    for (int j = 0; j < kChains; ++j) acc[j] = _mm_add_ps(_mm_mul_ps(acc[j], b), c);
  __m128 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm_add_ps(s, acc[j]);
  alignas(16) float out[4];
  _mm_store_ps(out, s);
  volatile float sink = out[0] + out[3];
  (void)sink;
  return 2.0 * 4 * kChains * static_cast<double>(iters);
}

float read(const float* x, size_t n) {
  __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm_add_ps(a0, _mm_loadu_ps(x + i));
    a1 = _mm_add_ps(a1, _mm_loadu_ps(x + i + 4));
    a2 = _mm_add_ps(a2, _mm_loadu_ps(x + i + 8));
    a3 = _mm_add_ps(a3, _mm_loadu_ps(x + i + 12));
  }
  alignas(16) float out[4];
  _mm_store_ps(out, _mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)));
  float s = out[0] + out[1] + out[2] + out[3];
  for (; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

const LimitLoops kLimitLoops = {fma, read};

}  // namespace troupe::bench::portable
