#pragma once
// The unit of work between the batcher (one Scheduler per worker) and a worker.
//
// Workers keep per-sequence state (core::SequenceTable): the tokens they know
// (the prompt, then every token they sampled themselves) and the block table.
// A StepPlan therefore carries a new sequence in full once, and afterwards
// only what changed (vLLM v1's "new" vs "cached" request data): how many
// tokens to run and which blocks were added. Bytes per decode step do not
// grow with the context. Because the worker feeds each sequence its own
// just-sampled token, the batcher can plan step k+1 while step k runs.
//
// A worker applies a plan in order: forget `drop`, learn `new_seqs`, then run
// `work` as one forward pass; the result brings back one token per sampling
// work item. Plain data, no torch: it crosses actors and the wire.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/sampling_params.hpp"

namespace troupe::core {

// A sequence the worker does not know yet: first admission, or again after a
// preemption (recompute) or a move from another worker.
struct NewSequence {
  uint64_t seq_id = 0;
  std::vector<int32_t> tokens;       // every known token: the prompt, then those generated before (resumed)
  int32_t num_cached = 0;            // leading tokens whose K/V its blocks already hold (prefix-cache hit)
  std::vector<int32_t> block_table;  // its KV blocks at admission (more come in SeqWork::new_blocks)
  SamplingParams sampling;
  int32_t num_generated = 0;  // trailing tokens of `tokens` that were generated (the penalties count them)
};

// One sequence's share of a step: a prompt chunk (prefill) or one token (decode).
struct SeqWork {
  uint64_t seq_id = 0;
  int32_t start_pos = 0;            // position of the first token to run: the worker's computed count
  int32_t num_tokens = 0;           // run positions [start_pos, start_pos + num_tokens); >= 1
  std::vector<int32_t> new_blocks;  // appended to its block table before it runs
  bool sample = false;              // sample the token at start_pos + num_tokens (decode, last prompt chunk)
  // Rows of this chunk whose logits score a prompt token (prompt_logprobs):
  // the LM head runs on them too. The scheduler's count, for step costs; not
  // on the wire (a worker finds them from the prompt it holds).
  int32_t score_rows = 0;
};

// Of a chunk's rows [start, start + n) of a sequence whose prompt has
// num_prompt tokens, how many score a prompt token (prompt_logprobs): row p
// scores the token at p + 1 while that is a prompt token, so rows [start,
// start + this). The scheduler counts them (SeqWork::score_rows); the worker
// runs the LM head on them (SeqChunk::score_ids).
inline int32_t prompt_rows_scored(int32_t start, int32_t n, int32_t num_prompt) {
  return std::max(0, std::min(start + n, num_prompt - 1) - start);
}

struct StepPlan {
  uint64_t step_id = 0;               // increases by one per plan of one scheduler
  std::vector<uint64_t> drop;         // sequences to forget first (finished, cancelled, preempted, moved)
  std::vector<NewSequence> new_seqs;  // sequences to learn next
  std::vector<SeqWork> work;          // the forward pass, in this order
  int64_t num_tokens() const {
    int64_t n = 0;
    for (const auto& w : work) n += w.num_tokens;
    return n;
  }
  bool empty() const { return work.empty(); }
};

struct SeqOutput {
  uint64_t seq_id = 0;
  SampledToken token;
};

// The logprobs of prompt tokens [start, start + tokens.size()) of one
// sequence (prompt_logprobs), scored by the rows of one chunk: the row of
// position p gives the token at p + 1. Each token's id is the prompt's.
struct PromptScores {
  uint64_t seq_id = 0;
  int32_t start = 0;  // >= 1: the first prompt token has nothing before it
  std::vector<SampledToken> tokens;
};

// A work item that did not run. The worker has forgotten the sequence.
struct SeqFailure {
  uint64_t seq_id = 0;
  std::string error;
  bool retryable = false;  // true: not the request's fault (e.g. the worker lost its state); run it again
};

struct StepResult {
  uint64_t step_id = 0;
  std::vector<SeqOutput> outputs;    // one per sampling work item that ran, in plan order
  std::vector<SeqFailure> failures;  // work items that did not run, in plan order
  std::vector<PromptScores> prompt_scores;  // one per work item that scored prompt tokens, in plan order
  std::string error;                 // non-empty: the whole step failed, nothing ran, and the worker
                                     // forgot every sequence of the step (outputs, failures empty)
  double forward_ms = 0.0;           // worker: model + sampling wall time
  double idle_ms = 0.0;              // worker: time it waited for this plan after finishing the previous one
};

// One work item resolved against the worker's state: what the model runs.
struct SeqChunk {
  uint64_t seq_id = 0;
  int32_t start_pos = 0;             // position of token_ids[0]; tokens before it are in the KV cache
  std::vector<int32_t> token_ids;    // tokens to run now (1 for decode)
  std::vector<int32_t> block_table;  // the sequence's blocks, covering start_pos + token_ids.size() slots
  bool sample = false;               // sample a token after the last one
  SamplingParams sampling;
  // When it samples under a penalty: the sequence's tokens before the one
  // sampled, the prompt's first (history_prompt of them; there only when the
  // sampling repeats_prompt()), then every generated one.
  std::vector<int32_t> history;
  int32_t history_prompt = 0;
  // prompt_logprobs: the prompt tokens its first rows predict (row i scores
  // score_ids[i], the token at start_pos + i + 1); empty otherwise.
  std::vector<int32_t> score_ids;
};

}  // namespace troupe::core
