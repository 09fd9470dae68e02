#pragma once
// StepExecutor: the worker's engine. Turns a StepPlan (the scheduler's chunks
// of many sequences) into one forward pass over the paged KV cache and one
// sampled token per sampling sequence.
//
// A chunk of sequence s runs token_ids at positions start_pos + i; token i's
// K/V goes to slot block_table[p / bs] * bs + p % bs (p its position, bs the
// cache's block size); attention sees the sequence's first
// start_pos + token_ids.size() positions (earlier ones must already be in the
// cache). A sampling chunk samples the row of its last token, at position
// start_pos + token_ids.size() (the index of the new token), with its own
// params: the choice depends on nothing else in the step.
//
// Holds no scheduling state; not thread-safe (one per worker thread).
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/step_plan.hpp"

namespace troupe::model {

class StepExecutor {
 public:
  // Keeps references: `model` and `cache` must outlive the executor.
  StepExecutor(const Gpt2& model, PagedKvCache& cache, PagedAttention attention = PagedAttention::kAuto);

  // Runs the step. An empty plan returns an empty result without a forward.
  // forward_ms is the wall time of the whole call (checks, forward, the
  // logits' copy to the CPU, sampling). Throws std::invalid_argument naming
  // the seq_id, before the cache is touched, when the plan is impossible.
  StepResult execute(const StepPlan& plan);

  // Checks every chunk: tokens present and inside the vocabulary, start_pos
  // >= 0, start_pos + tokens <= n_positions, the block table covering every
  // position with distinct blocks inside the pool, valid sampling params, no
  // seq_id twice, no KV slot written twice. Throws std::invalid_argument.
  void validate(const StepPlan& plan) const;

  // Builds the flat batch (index tensors on the CPU; forward_step validates
  // there and moves them to the model's device itself).
  FlatBatch flatten(const StepPlan& plan) const;

 private:
  const Gpt2& model_;
  PagedKvCache& cache_;
  PagedAttention attention_;
};

}  // namespace troupe::model
