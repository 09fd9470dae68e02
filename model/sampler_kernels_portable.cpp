// The sampler kernels compiled for portable (flags, and -ffp-contract=off, from CMakeLists.txt).
#define TROUPE_ISA_NS portable
#include "model/sampler_kernels.inc"
