// The sampler kernels compiled for avx512 (flags, and -ffp-contract=off, from CMakeLists.txt).
#define TROUPE_ISA_NS avx512
#include "model/sampler_kernels.inc"
