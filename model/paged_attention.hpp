#pragma once
// Attention of a flat batch over a paged KV cache (PagedAttention, Kwon et al.,
// SOSP 2023), in two implementations with the same contract:
//  * paged_attention_cpu    — reads K/V blocks in place through the block
//                             table; CPU, fp32 queries, fp32 or bfloat16 K/V
//                             (widened in registers).
//  * paged_attention_gather — portable torch ops (gather the blocks, matmul,
//                             mask, softmax, matmul); any device.
//
// Contract. Sequence s owns query rows [query_start[s], query_start[s+1]) of q,
// and context_lens[s] tokens in the cache (this step's included). Its rows are
// its newest tokens, so row i sits at position p = context_lens[s] -
// (query_start[s+1] - i) and attends to positions 0..p of s (causal). Position
// j of s lives in block block_tables[s][j / bs], offset j % bs.
// Arguments are assumed valid (Gpt2::forward_step checks them).
#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace troupe::model {

struct PagedAttentionInput {
  torch::Tensor q;                    // [T, n_head, head_dim] fp32, last dim contiguous
  torch::Tensor k_pool, v_pool;       // [num_blocks, n_head, block_size, head_dim] contiguous, fp32 or bf16
  std::vector<int64_t> query_start;   // [S + 1], query_start[0] = 0, query_start[S] = T
  std::vector<int64_t> context_lens;  // [S], >= the sequence's query rows
  torch::Tensor block_tables;         // [S, max_blocks] int32 (the kernel wants it on the CPU)
  double scale = 0.0;                 // softmax scale; 0 = 1/sqrt(head_dim)
};

// Returns [T, n_head, head_dim] contiguous. Parallel over (sequence, head,
// tile of queries) with at::parallel_for; online softmax with fp32 accumulation.
torch::Tensor paged_attention_cpu(const PagedAttentionInput& in);

// Same result through torch ops on q's device. Decode rows (one query per
// sequence) go through one padded batched matmul; prefill chunks one by one.
torch::Tensor paged_attention_gather(const PagedAttentionInput& in);

}  // namespace troupe::model
