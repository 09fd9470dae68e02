#pragma once
// How one sequence picks its next token, and the check of those parameters.
// Torch-free: the router checks a job at submission, the batcher carries the
// parameters in step plans, the worker's sampler (model/sampler.hpp) obeys them.
#include <cstdint>
#include <utility>
#include <vector>

namespace troupe::core {

// Largest K accepted in SamplingParams::logprobs.
constexpr int32_t kMaxLogprobs = 20;

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
};

// One sampled token, with what the request asked to know about it.
struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;                        // log-softmax of the unscaled logits (0 without logprobs)
  std::vector<std::pair<int32_t, float>> top;  // top-K alternatives (id, logprob), most likely first
};

// Throws std::invalid_argument unless temperature is finite and >= 0,
// top_k >= 0, top_p is in (0, 1] and logprobs is in [-1, kMaxLogprobs].
void validate(const SamplingParams& params);

}  // namespace troupe::core
