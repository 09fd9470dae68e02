#pragma once
// Picks the next token from a row of logits: greedy, temperature, top-k,
// top-p (nucleus sampling, Holtzman et al. 2020, "The Curious Case of Neural
// Text Degeneration"), and logprobs.
//
// Determinism: the choice is a pure function of (logits, params, position).
// The random number is a counter-based hash of (seed, position) (splitmix64,
// Steele et al. 2014), never a stateful generator, so a seeded sequence draws
// the same tokens whatever shares its batch, in whichever row or thread, and
// after preemption and recompute. Tokens are ranked by raw logit (descending,
// lower id first on ties) and the draw walks the inverse CDF in that rank
// order; all arithmetic on the path to the chosen id is plain IEEE (no libm,
// no FMA contraction), so equal logits give equal tokens on every machine.
//
// Torch-free apart from sample_rows, which takes a forward-declared tensor.
#include <cstdint>
#include <vector>

#include "model/step_plan.hpp"

namespace at {
class Tensor;
}

namespace troupe::model {

// Largest K accepted in SamplingParams::logprobs.
constexpr int32_t kMaxLogprobs = 20;

// Throws std::invalid_argument unless temperature is finite and >= 0,
// top_k >= 0, top_p is in (0, 1] and logprobs is in [-1, kMaxLogprobs].
// Cheap; the scheduler calls it when a request is submitted.
void validate(const SamplingParams& params);

// The uniform draw in [0, 1) used for the token at `position` of a sequence
// seeded with `seed` (53 random bits).
double sampling_uniform(uint64_t seed, int64_t position);

// Samples one token from `logits[0, vocab)` (raw, unscaled). `position` is the
// index in its sequence of the token being sampled (prompt_len for the first
// generated token). Order of operations: greedy if temperature == 0; else
// logits / temperature, keep the top_k most likely, keep the smallest prefix
// (in rank order) whose probability mass is >= top_p (at least one token),
// renormalise, draw. When params.logprobs >= 0, `logprob` is the log-softmax of
// the raw logits at the chosen id and `top` holds the K most likely ids under
// the raw logits, most likely first; when it is -1, `logprob` is 0 and `top`
// empty. Throws std::invalid_argument on bad params or vocab < 1, and
// std::runtime_error when the logits hold NaN or +inf, or are all -inf.
SampledToken sample(const float* logits, int64_t vocab, const SamplingParams& params,
                    int64_t position);

// Samples row r of `logits` [R, V] (any floating dtype, any device: copied to
// CPU fp32 once) with params[r] at positions[r]; rows run in parallel
// (at::parallel_for). All params are validated before any row is sampled.
std::vector<SampledToken> sample_rows(const at::Tensor& logits,
                                      const std::vector<SamplingParams>& params,
                                      const std::vector<int64_t>& positions);

}  // namespace troupe::model
