// Multiply-add peak and streaming-read loops with SSE (x86-64-v2 has no FMA:
// a multiply and an add per step; flags from CMakeLists.txt).
#include <immintrin.h>

#include "machine_limits_kernels.hpp"

namespace troupe::bench::portable {
namespace {

struct Isa {
  using V = __m128;
  static constexpr int kLanes = 4;
  static V set1(float x) { return _mm_set1_ps(x); }
  static V zero() { return _mm_setzero_ps(); }
  static V madd(V a, V b, V c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
  static V add(V a, V b) { return _mm_add_ps(a, b); }
  static V loadu(const float* p) { return _mm_loadu_ps(p); }
  static void store(float* p, V v) { _mm_store_ps(p, v); }
};
// 14 independent chains (of 16 xmm registers; 2 hold the constants): a
// multiply then an add, ~7 cycles of latency, on 2 multiply + 2 add pipes.
constexpr int kChains = 14;

#include "machine_limits_loops.inc"

}  // namespace

const LimitLoops kLimitLoops = {fma, read};

}  // namespace troupe::bench::portable
