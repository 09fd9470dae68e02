// The sampler kernels compiled for avx2 (flags, and -ffp-contract=off, from CMakeLists.txt).
#define TROUPE_ISA_NS avx2
#include "model/sampler_kernels.inc"
