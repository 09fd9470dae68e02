#pragma once
// The unit of work between the scheduler (batcher) and a worker: a StepPlan
// says which tokens of which sequences go through the model in one forward
// pass; a StepResult brings back one sampled token per sampling sequence.
// Plain data, no torch: it crosses actors and (later) the wire.
#include <cstdint>
#include <utility>
#include <vector>

namespace troupe::model {

// How one sequence picks its next token. The worker's choice is a pure
// function of (logits, params, position): the random stream is keyed by
// (seed, position of the token being sampled), so a seeded request gives the
// same tokens whatever shares its batch and after preemption.
struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax); must be >= 0
  int32_t top_k = 0;         // keep the k most likely tokens; 0 = off
  float top_p = 1.0f;        // nucleus: smallest set with mass >= top_p; 1 = off; (0, 1]
  uint64_t seed = 0;         // always set: the scheduler picks one when the user gives none
  int32_t logprobs = -1;     // -1 = no logprobs; K >= 0 = chosen token's logprob + top K alternatives
};

// One sequence's share of a step: a prompt chunk (prefill) or one token (decode).
struct SeqChunk {
  uint64_t seq_id = 0;
  int32_t start_pos = 0;               // position of token_ids[0]; tokens before it are in the KV cache
  std::vector<int32_t> token_ids;      // tokens to run now (1 for decode)
  std::vector<int32_t> block_table;    // KV blocks of the sequence, covering start_pos + token_ids.size() slots
  bool sample = false;                 // sample a token after the last one (decode, or the last prompt chunk)
  SamplingParams sampling;
};

struct StepPlan {
  uint64_t step_id = 0;
  std::vector<SeqChunk> seqs;
  int64_t num_tokens() const {
    int64_t n = 0;
    for (const auto& s : seqs) n += static_cast<int64_t>(s.token_ids.size());
    return n;
  }
};

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;                          // log-softmax of the unscaled logits
  std::vector<std::pair<int32_t, float>> top;    // top-K alternatives (id, logprob), most likely first
};

struct SeqOutput {
  uint64_t seq_id = 0;
  SampledToken token;
};

struct StepResult {
  uint64_t step_id = 0;
  std::vector<SeqOutput> outputs;  // one per SeqChunk with sample = true, in plan order
  double forward_ms = 0.0;         // model time on the worker
};

}  // namespace troupe::model
