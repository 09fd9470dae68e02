// The paged-attention tile kernel compiled for portable (flags from CMakeLists.txt).
#define TROUPE_ISA_NS portable
#include "model/paged_attention_tile.inc"
