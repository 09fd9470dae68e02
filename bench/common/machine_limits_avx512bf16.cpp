// The avx512bf16 variant's limit loops (flags from CMakeLists.txt): AVX-512's
// FMA and read loops, and the peak of vdpbf16ps, the instruction its
// bfloat16-weight kernel runs (model/linear_avx512bf16.cpp).
#include <immintrin.h>

#include "machine_limits_kernels.hpp"

namespace troupe::bench::avx512bf16 {
namespace {

#include "machine_limits_avx512.inc"

// kChains independent vdpbf16ps chains: each instruction is 2 multiply-adds
// a lane (4 floating-point operations).
double dot_bf16(int64_t iters) {
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(1.0f + 0.001f * j);
  volatile float a_in = 0.9999f, b_in = 1e-3f;
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(a_in), _mm512_set1_ps(a_in));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(b_in), _mm512_set1_ps(b_in));
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, acc[j]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  volatile float sink = out[0] + out[15];
  (void)sink;
  return 4.0 * 16 * kChains * static_cast<double>(iters);
}

}  // namespace

const LimitLoops kLimitLoops = {fma, read, dot_bf16};

}  // namespace troupe::bench::avx512bf16
