// FMA-peak and streaming-read loops with AVX-512 (flags from CMakeLists.txt).
#include <immintrin.h>

#include "machine_limits_kernels.hpp"

namespace troupe::bench::avx512 {
namespace {

#include "machine_limits_avx512.inc"

}  // namespace

const LimitLoops kLimitLoops = {fma, read};

}  // namespace troupe::bench::avx512
