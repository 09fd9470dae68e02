#pragma once
// The CPU paged-attention kernel's inner part, one variant per instruction
// set (paged_attention_{avx512,avx2,portable}.cpp all compile
// paged_attention_tile.inc with their own flags). Internal to model/:
// paged_attention.cpp splits the work into tiles and calls the variant the
// process runs.
#include <cstdint>

#include "model/cpu_features.hpp"

namespace troupe::model {

// Queries of one sequence that share a pass over its K/V blocks: each block
// is loaded once per tile and stays in L1 (16 x 64 fp32 = 4 KiB); in a long
// tile the queries are the vector lanes.
constexpr int64_t kAttentionQueryTile = 16;

// Up to kAttentionQueryTile consecutive query rows of one sequence and one
// head. Row i sits at position first_pos + i and attends to positions
// 0..first_pos + i of its sequence (causal); position j lives in block
// table[j / block_size] at offset j % block_size. Only those positions are
// read: slots past them may hold anything.
struct AttentionTile {
  const float* q;  // row i's head vector at q + i * q_stride (head_dim contiguous floats)
  int64_t q_stride;
  const void* k_pool;  // [num_blocks, n_head, block_size, head_dim] contiguous, fp32
  const void* v_pool;  // or bfloat16's bits (uint16_t) when kv_bfloat16
  bool kv_bfloat16 = false;
  const int32_t* table;  // the sequence's block table
  int64_t n_head, head, head_dim, block_size;
  int64_t first_pos;  // position of row 0
  int64_t rows;       // 1..kAttentionQueryTile
  float scale;        // softmax scale
  float* out;         // row i's output at out + i * out_stride (head_dim floats)
  int64_t out_stride;
  // A decode (rows == 1) may cover heads [head, head + heads): head head + h
  // reads its query at q + h * q_head_stride and writes out + h *
  // out_head_stride.
  int64_t heads = 1;
  int64_t q_head_stride = 0, out_head_stride = 0;
};

// Floats of scratch one call needs (a decode tile of up to `heads` heads).
inline int64_t attention_scratch_floats(int64_t head_dim, int64_t block_size, int64_t heads = 1) {
  const int64_t tile = 2 * kAttentionQueryTile * head_dim + block_size * kAttentionQueryTile +
                       2 * kAttentionQueryTile + block_size;
  // (a decode: queries, outputs, a vector of running sums (at most 16 lanes) and a max per head)
  const int64_t multi = 2 * heads * head_dim + 16 * heads + 2 * heads + block_size;
  return tile > multi ? tile : multi;
}

using AttendTileFn = void (*)(const AttentionTile& tile, float* scratch);

// The variant's kernel (every CpuIsa has one).
AttendTileFn attend_tile_kernel(CpuIsa isa);

namespace avx512 {
void attend_tile(const AttentionTile& tile, float* scratch);
}
namespace avx2 {
void attend_tile(const AttentionTile& tile, float* scratch);
}
namespace portable {
void attend_tile(const AttentionTile& tile, float* scratch);
}

}  // namespace troupe::model
