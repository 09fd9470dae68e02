#pragma once
// The per-variant loops behind machine_limits.hpp, each compiled for its ISA
// (machine_limits_{avx512bf16,avx512,avx2,portable}.cpp).
#include <cstddef>
#include <cstdint>

namespace troupe::bench {

struct LimitLoops {
  // Runs `iters` rounds of independent register multiply-adds; returns the
  // floating-point operations done (2 per multiply-add per lane).
  double (*fma)(int64_t iters);
  // Sum of x[0, n) (read once, in order); the value only defeats dead-code
  // elimination.
  float (*read)(const float* x, size_t n);
  // Like fma with the bfloat16 dot product (vdpbf16ps, 2 multiply-adds a
  // lane); nullptr where the variant has none.
  double (*dot_bf16)(int64_t iters) = nullptr;
};

namespace avx512 {
extern const LimitLoops kLimitLoops;
}
namespace avx2 {
extern const LimitLoops kLimitLoops;
}
namespace avx512bf16 {
extern const LimitLoops kLimitLoops;
}
namespace portable {
extern const LimitLoops kLimitLoops;
}

}  // namespace troupe::bench
