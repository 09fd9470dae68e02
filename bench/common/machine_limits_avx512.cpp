// FMA-peak and streaming-read loops with AVX-512 (flags from CMakeLists.txt).
#include <immintrin.h>

#include "machine_limits_kernels.hpp"

namespace troupe::bench::avx512 {
namespace {

struct Isa {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V madd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_store_ps(p, v); }
};
// 16 independent chains: 2 FMA pipes x 4-cycle latency need 8; 16 leaves
// room for a 512-bit pipe that issues one per cycle with latency up to 8.
constexpr int kChains = 16;

#include "machine_limits_loops.inc"

}  // namespace

const LimitLoops kLimitLoops = {fma, read};

}  // namespace troupe::bench::avx512
