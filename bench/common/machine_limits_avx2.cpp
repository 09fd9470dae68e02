// FMA-peak and streaming-read loops with AVX2 + FMA (flags from CMakeLists.txt).
#include <immintrin.h>

#include "machine_limits_kernels.hpp"

namespace troupe::bench::avx2 {
namespace {

struct Isa {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V madd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_store_ps(p, v); }
};
// 12 independent chains of the 16 ymm registers: 2 FMA pipes x 4-5 cycles
// of latency need 8-10.
constexpr int kChains = 12;

#include "machine_limits_loops.inc"

}  // namespace

const LimitLoops kLimitLoops = {fma, read};

}  // namespace troupe::bench::avx2
