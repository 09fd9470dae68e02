// The paged-attention tile kernel compiled for avx2 (flags from CMakeLists.txt).
#define TROUPE_ISA_NS avx2
#include "model/paged_attention_tile.inc"
