#pragma once
// Gpt2: GPT-2's forward pass in libtorch (fp32, tanh GELU, LayerNorm eps from
// the config, LM head tied to wte), on any torch device.
//
// Three ways to run it, all the same math:
//  * forward_full      — whole sequence, no cache (the O(N^2) reference loop).
//  * forward_contiguous — one sequence with a contiguous per-layer K/V cache.
//  * forward_step      — a flat batch of many sequences over a PagedKvCache
//                        (the varlen layout of vLLM: prefill chunks and decode
//                        tokens mixed in one [T] batch).
#include <cstdint>
#include <functional>
#include <vector>

#include <torch/types.h>

#include "model/config.hpp"
#include "model/linear.hpp"
#include "model/weights.hpp"

namespace troupe::model {

class PagedKvCache;

// Contiguous K/V cache of one sequence: per layer [n_head, capacity, head_dim].
struct ContiguousKv {
  std::vector<torch::Tensor> k, v;
  int64_t length = 0;    // tokens held
  int64_t capacity = 0;  // tokens that fit
};

// One step's tokens, flattened. Built from a StepPlan by the step executor.
// Index tensors are integer tensors on any device: forward_step checks every
// index on a CPU copy before it writes anything, then moves what it needs to
// the model's device (the step executor builds them on the CPU, so on a CPU
// model nothing is copied).
struct FlatBatch {
  torch::Tensor token_ids;     // [T]
  torch::Tensor positions;     // [T] absolute position of each token in its sequence
  torch::Tensor slot_mapping;  // [T] KV slot (block * block_size + offset) each token's K/V is written to
  std::vector<int64_t> query_start;   // [S + 1] sequence s owns rows [query_start[s], query_start[s+1])
  std::vector<int64_t> context_lens;  // [S] tokens in the KV cache of sequence s once this step's are written
  torch::Tensor block_tables;         // [S, max_blocks] int32, padded with 0; CPU or device
  std::vector<int64_t> sample_rows;   // rows of T whose logits are returned, in order
};

// How attention reads the paged cache.
enum class PagedAttention {
  kAuto,    // the in-place CPU kernel on CPU, the gather path elsewhere
  kKernel,  // in-place CPU kernel (CPU tensors only)
  kGather,  // portable torch ops: gather the sequence's blocks, then matmul/softmax
};

// Which rows of forward_contiguous get logits: the LM head is the largest
// matrix (vocab x n_embd), and a generation loop samples only the last row.
enum class LogitRows {
  kAll,   // one row per input token
  kLast,  // the last input token's row only
};

// Causal attention of T query rows, the newest of L positions, over their L
// keys: q [T, H, D]; k, v [H, L, D] (row i sees keys 0 .. L - T + i); returns
// [T, H * D]. Scores are built for as many rows at a time as fit
// `max_block_bytes` ([H, rows, L] floats): a whole [12, 1024, 1024] matrix
// (50 MB) passed the heap's 32 MiB mmap threshold, so every layer's was mapped
// afresh, and a kv-loop prefill of 850 tokens ran at 40% of the speed of 800's.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                               int64_t max_block_bytes = int64_t{8} << 20);

class Gpt2 {
 public:
  // Copies the weights to `device` in the layout the forward pass wants.
  // Pass them with std::move when nothing else needs them: each is then
  // freed as soon as its copy exists (loaded and packed never coexist whole).
  // `dtype`: the weight matrices' storage (linear.hpp's WeightDtype: bfloat16
  // halves the bytes each step streams, int8 quarters them; the math stays
  // fp32, on the rounded or dequantized weights).
  Gpt2(const Gpt2Config& config, Gpt2Weights weights, torch::Device device,
       WeightDtype dtype = WeightDtype::kFloat32);

  const Gpt2Config& config() const { return config_; }
  torch::Device device() const { return device_; }
  WeightDtype dtype() const { return dtype_; }

  // Logits [T, vocab] (fp32, on the model's device) for every position of `ids`.
  // Caller mistakes (no tokens, too many, ids outside the vocabulary, a full
  // cache) throw std::invalid_argument.
  torch::Tensor forward_full(const std::vector<int32_t>& ids) const;

  ContiguousKv make_contiguous_cache(int64_t capacity) const;
  // Appends `ids` to the cache and returns the logits [ids.size(), vocab]
  // (kAll) or [1, vocab] for the last id (kLast).
  torch::Tensor forward_contiguous(const std::vector<int32_t>& ids, ContiguousKv& cache,
                                   LogitRows rows = LogitRows::kAll) const;

  // Writes the step's K/V into its slots and returns logits [sample_rows.size(), vocab].
  // Sequence s's rows must be its newest tokens in order (position of row i =
  // context_lens[s] - (query_start[s+1] - i)) and each slot must be the one its
  // block table gives for that position. Every index is checked before any
  // write: a bad batch throws std::invalid_argument and leaves the cache as it was.
  torch::Tensor forward_step(const FlatBatch& batch, PagedKvCache& cache,
                             PagedAttention attention = PagedAttention::kAuto) const;
  // The same step, returning the last block's output [sample_rows.size(), E]
  // for those rows instead of logits: lm_head() of any slice of it gives
  // their logits, so a caller that needs many rows' logits can take them a
  // few at a time (forward_step = lm_head(forward_step_hidden)).
  torch::Tensor forward_step_hidden(const FlatBatch& batch, PagedKvCache& cache,
                                    PagedAttention attention = PagedAttention::kAuto) const;
  // ln_f, then the LM head: logits [R, vocab] of hidden rows [R, E].
  torch::Tensor lm_head(const torch::Tensor& hidden) const;

 private:
  // Weights on device_. Each projection is a Linear: packed for the
  // process's kernel variant on a CPU (cpu_features.hpp), HF's [in, out]
  // tensor for addmm elsewhere.
  struct Layer {
    torch::Tensor ln1_w, ln1_b, attn_b, attn_proj_b, ln2_w, ln2_b, fc_b, fc_proj_b;
    Linear attn, attn_proj, fc, fc_proj;
  };
  // attend(layer, q, k, v): q, k, v are [T, n_head, head_dim] views of the
  // layer's fused QKV projection; returns the merged heads [T, n_embd].
  using AttendFn =
      std::function<torch::Tensor(int, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;
  torch::Tensor embed(const torch::Tensor& ids, const torch::Tensor& positions) const;
  // Runs every block on x [T, E]. With keep_rows defined, the last block keeps
  // only those rows after its attention (what follows is per row), so the
  // result is [keep_rows.size(0), E].
  torch::Tensor run_blocks(torch::Tensor x, const AttendFn& attend, const torch::Tensor& keep_rows) const;
  void check_ids(const std::vector<int32_t>& ids, const char* who) const;

  Gpt2Config config_;
  torch::Device device_;
  WeightDtype dtype_ = WeightDtype::kFloat32;
  // The LM head x @ wte^T; embed() reads token rows from it too (tied
  // weights, one copy of wte).
  Linear head_;
  torch::Tensor wpe_, ln_f_w_, ln_f_b_;
  std::vector<Layer> layers_;
};

}  // namespace troupe::model
