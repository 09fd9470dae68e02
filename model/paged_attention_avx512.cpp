// The paged-attention tile kernel compiled for avx512 (flags from CMakeLists.txt).
#define TROUPE_ISA_NS avx512
#include "model/paged_attention_tile.inc"
