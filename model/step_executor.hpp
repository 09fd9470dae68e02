#pragma once
// StepExecutor: the worker's engine. Keeps the worker's per-sequence state
// (core::SequenceTable) and turns each StepPlan (drops, new sequences, work
// deltas) into one forward pass over the paged KV cache and one sampled token
// per sampling sequence.
//
// A chunk of sequence s runs token_ids at positions start_pos + i; token i's
// K/V goes to slot block_table[p / bs] * bs + p % bs (p its position, bs the
// cache's block size); attention sees the sequence's first
// start_pos + token_ids.size() positions (earlier ones must already be in the
// cache). A sampling chunk samples the row of its last token, at position
// start_pos + token_ids.size() (the index of the new token), with its own
// params: the choice depends on nothing else in the step.
//
// Failure isolation: a work item the plan gets wrong, or a row whose logits
// cannot be sampled (NaN), fails that sequence only (StepResult::failures);
// an exception in the forward pass fails the step (StepResult::error) and the
// worker forgets the step's sequences. execute() never throws for either.
//
// Not thread-safe (one per worker thread).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/heap_pages.hpp"
#include "core/sequence_table.hpp"
#include "core/step_plan.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"

namespace troupe::model {

class StepExecutor {
 public:
  // Keeps references: `model` and `cache` must outlive the executor. Its heap
  // trim threshold comes from TROUPE_HEAP_TRIM (core::HeapTrimPolicy; throws
  // std::invalid_argument for a bad value). Unless TROUPE_KV_PREFAULT=0, it
  // has the cache map its pools' pages ahead of the blocks each step writes
  // (PagedKvCache::map_ahead); none before the first step, so an idle
  // worker holds no pool pages.
  StepExecutor(const Gpt2& model, PagedKvCache& cache, PagedAttention attention = PagedAttention::kAuto);

  // The worker's step. forward_ms is the wall time of the whole call. In the
  // step after a large one (core::HeapTrimPolicy), the heap's free pages
  // (core::release_free_heap: the large step's activations) and the kernels'
  // scratch (release_kernel_scratch) go back to the kernel.
  core::StepResult execute(const core::StepPlan& plan);

  // Runs resolved chunks (no per-sequence state): one forward pass, then
  // prompt scores (a chunk's score_ids, appended to `scores`, the LM head on
  // at most 128 rows at a time), then sampling. Returns one output per
  // sampling chunk whose row sampled, in order; rows that could not be
  // scored or sampled fail their sequence (`failures`). Throws
  // std::invalid_argument naming the seq_id, before the cache is touched,
  // when a chunk is impossible (see validate), and whatever the forward pass
  // throws.
  std::vector<core::SeqOutput> run(const std::vector<core::SeqChunk>& chunks,
                                   std::vector<core::SeqFailure>& failures,
                                   std::vector<core::PromptScores>& scores);
  // The same for chunks that score no prompt token (std::logic_error if one does).
  std::vector<core::SeqOutput> run(const std::vector<core::SeqChunk>& chunks,
                                   std::vector<core::SeqFailure>& failures) {
    std::vector<core::PromptScores> scores;
    auto out = run(chunks, failures, scores);
    if (!scores.empty()) throw std::logic_error("StepExecutor::run: a chunk scored prompt tokens; take its scores");
    return out;
  }

  // Checks every chunk: tokens present and inside the vocabulary, start_pos
  // >= 0, start_pos + tokens <= n_positions, the block table covering every
  // position with distinct blocks inside the pool, valid sampling params, no
  // seq_id twice, no KV slot written twice. Throws std::invalid_argument.
  void validate(const std::vector<core::SeqChunk>& chunks) const;

  // Builds the flat batch (index tensors on the CPU; forward_step validates
  // there and moves them to the model's device itself).
  FlatBatch flatten(const std::vector<core::SeqChunk>& chunks) const;

  const core::SequenceTable& sequences() const { return table_; }
  // execute()'s HeapTrimPolicy threshold (tokens a step; 0: never release).
  void set_heap_trim_tokens(int64_t min_tokens) { heap_trim_ = core::HeapTrimPolicy(min_tokens); }
  // How the KV pools get mapped (the constructor applies the process's
  // TROUPE_KV_PREFAULT; tests set others): kAhead, steps map them ahead of
  // the blocks they write; kWhole, the cache starts mapping every pool now.
  void set_kv_prefault(KvPrefault mode);
  // How often execute() released the free heap.
  int64_t heap_releases() const { return heap_releases_; }
  // Prompt rows whose logits exist at once (default 128: [128, 50257] fp32
  // is 25 MiB, under the heap's 32 MiB mmap threshold); >= 1. Tests lower it.
  void set_score_rows_per_call(int64_t rows) { score_rows_per_call_ = std::max<int64_t>(1, rows); }

 private:
  const Gpt2& model_;
  PagedKvCache& cache_;
  PagedAttention attention_;
  core::SequenceTable table_;
  int64_t score_rows_per_call_ = 128;
  core::HeapTrimPolicy heap_trim_;
  bool prefault_ = false;  // TROUPE_KV_PREFAULT unset or 1: map the KV pools ahead of the blocks written
  int64_t heap_releases_ = 0;
};

}  // namespace troupe::model
