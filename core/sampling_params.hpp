#pragma once
// How one sequence picks its next token, and the check of those parameters.
// Torch-free: the router checks a job at submission, the batcher carries the
// parameters in step plans, the worker's sampler (model/sampler.hpp) obeys them.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::core {

// Largest K accepted in SamplingParams::logprobs.
constexpr int32_t kMaxLogprobs = 20;
// Bounds of the logit adjustments (OpenAI's): |penalty| <= 2, |bias| <= 100,
// and at most kMaxLogitBias biased ids; repetition_penalty in (0, 10].
constexpr float kMaxPenalty = 2.0f;
constexpr float kMaxRepetitionPenalty = 10.0f;
constexpr float kMaxBias = 100.0f;
constexpr size_t kMaxLogitBias = 1024;

// The worker's choice is a pure function of (logits, params, position): the
// random stream is keyed by (seed, position of the token being sampled), so a
// seeded request gives the same tokens whatever shares its batch, on whichever
// worker, and after preemption or a move to another worker.
struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax); must be finite and >= 0
  int32_t top_k = 0;         // keep the k most likely tokens; 0 = off
  float top_p = 1.0f;        // nucleus: smallest set with mass >= top_p; 1 = off; (0, 1]
  uint64_t seed = 0;         // always set by the time a plan carries it (router or scheduler picks one)
  int32_t logprobs = -1;     // -1 = no logprobs; K in [0, kMaxLogprobs] = chosen token's logprob + top K
  // -1 = none; K in [0, kMaxLogprobs]: the logprob (and rank) of every prompt
  // token after the first under the model's raw logits, and the top K
  // alternatives at each position (vLLM's prompt_logprobs; OpenAI's echo).
  // The worker runs the LM head on the prompt's rows as well.
  int32_t prompt_logprobs = -1;
  // Adjustments to the raw logits before temperature, top-k and top-p, in
  // this order: logit[t] + bias[t] (OpenAI's logit_bias); then for every t
  // in the prompt or generated so far, / repetition_penalty when positive,
  // * repetition_penalty otherwise (CTRL's, as Hugging Face and vLLM apply
  // it); then - (frequency_penalty * c[t] + presence_penalty) where c[t] > 0,
  // c[t] being how many times t was generated so far (OpenAI's; the prompt
  // does not count).
  float presence_penalty = 0.0f;                      // [-kMaxPenalty, kMaxPenalty]
  float frequency_penalty = 0.0f;                     // [-kMaxPenalty, kMaxPenalty]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias), ids strictly increasing
  float repetition_penalty = 1.0f;                    // (0, kMaxRepetitionPenalty]; 1 = off

  // Whether the sampler needs the generated tokens (counts_generated), or
  // the prompt's as well (repeats_prompt).
  bool counts_generated() const { return presence_penalty != 0.0f || frequency_penalty != 0.0f; }
  bool repeats_prompt() const { return repetition_penalty != 1.0f; }
  bool adjusts_logits() const { return counts_generated() || repeats_prompt() || !logit_bias.empty(); }
};

// One sampled token, with what the request asked to know about it.
struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;                        // log-softmax of the unscaled logits (0 without logprobs)
  std::vector<std::pair<int32_t, float>> top;  // top-K alternatives (id, logprob), most likely first
  int32_t rank = 0;  // a scored prompt token's 1-based rank under the raw logits (1 + ids above it); 0 = not given
};

// Throws std::invalid_argument unless temperature is finite and >= 0,
// top_k >= 0, top_p is in (0, 1], logprobs and prompt_logprobs are in [-1, kMaxLogprobs], the
// penalties are in [-kMaxPenalty, kMaxPenalty], repetition_penalty in
// (0, kMaxRepetitionPenalty], and logit_bias has at most
// kMaxLogitBias entries, ids >= 0 strictly increasing, biases in
// [-kMaxBias, kMaxBias].
void validate(const SamplingParams& params);
// The same, and every logit_bias id below `vocab`.
void validate(const SamplingParams& params, int64_t vocab);
// A logit_bias key as OpenAI's JSON and troupe's flags write a token id:
// decimal digits only, at most 9 of them (so it fits int32); nullopt
// otherwise. Whether the id is in the vocabulary is validate()'s check.
std::optional<int32_t> token_id_from_text(const std::string& text);
// Sorts `bias` by id for SamplingParams::logit_bias; throws
// std::invalid_argument when an id appears twice.
std::vector<std::pair<int32_t, float>> sorted_logit_bias(std::vector<std::pair<int32_t, float>> bias);

}  // namespace troupe::core
