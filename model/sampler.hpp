#pragma once
// Picks the next token from a row of logits: greedy, temperature, top-k,
// top-p (nucleus sampling, Holtzman et al. 2020, "The Curious Case of Neural
// Text Degeneration"), and logprobs.
//
// Method: the Gumbel-max trick (Gumbel 1954; Maddison, Tarlow & Minka 2014,
// "A* Sampling"; review: Huijben et al. 2022, "A Review of the Gumbel-max
// Trick and its Extensions"). Among the kept ids (after temperature, top-k
// and top-p), the token is argmax_i (logit_i / T + g_i) with g_i a standard
// Gumbel variable, which is an exact sample of softmax(logits / T)
// renormalised over the kept set. The noise g_i is a counter-based hash of
// (seed, position, token id), never a stateful generator: splitmix64
// (Steele et al. 2014) turns (seed, position) into a 64-bit row key once per
// row, and two keyed rounds of a 32-bit mixer (lowbias32) turn (key, id) into
// 32 bits per token, so the per-token work vectorises on AVX2 and SSE4.1 as
// well as AVX-512. An id whose scaled logit is more than the noise's upper
// bound (22.2) below the best score found so far cannot win: its noise is
// never computed, so a peaked row costs little. Nor is the noise of an id
// whose hashed bits alone show it too small to reach the best score (the
// noise falls as the bits grow): on a flat row, once the best is ~log(n),
// only ~1 id in 10^4 passes that check, so a flat row costs little too.
// Top-p: the nucleus is a rank-order prefix whose ids keep their scores, so
// the whole row's winner is the nucleus's when the weight ranked before it is
// under top_p of the total (one pass; probability ~top_p); otherwise the
// nucleus is found from bucketed masses (no sort of the row) and its winner
// drawn from it.
//
// Robustness: a numerically equivalent path (paged vs contiguous KV, alone vs
// in a batch whose GEMMs sum in another order) perturbs logits by ~1e-6. That
// changes the winner only when the best two perturbed scores are that close,
// and their gap is ~Exp(1), so a seeded sequence draws the same tokens
// whatever shares its batch, in whichever row or thread, and after
// preemption and recompute. (An inverse-CDF draw in rank order is exact too,
// but any reordering of near-equal logits moves the same uniform onto another
// token.) Top-p membership is still decided on ranked probabilities; a flip
// at the nucleus boundary needs the winner to be the boundary token.
//
// Bits: everything on the path to the chosen id is plain IEEE with the
// project's own exp and log polynomials (no libm, no FMA contraction), so
// equal logits give equal tokens on every machine and SIMD width. The
// per-token loops run in the kernel variant the process chose
// (sampler_kernels.hpp, cpu_features.hpp); every variant gives the same bits.
//
// Torch-free apart from sample_rows, which takes a forward-declared tensor.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/sampling_params.hpp"

namespace at {
class Tensor;
}

namespace troupe::model {

// The parameters and their check live in the torch-free core.
using core::kMaxLogprobs;
using core::SampledToken;
using core::SamplingParams;
using core::validate;

// The Gumbel noise g added to token `token`'s scaled logit when sampling the
// token at `position` of a sequence seeded with `seed`: -log(-log(u)) for a
// hashed u in (0, 1) on a 2^-31 grid, so g lies in [-2.82, 22.2] (the cut
// tails have probability < 1e-7 per token).
float gumbel_noise(uint64_t seed, int64_t position, int32_t token);
// The 32 hashed bits gumbel_noise turns into noise: u = top 31 bits (k) as
// v = (k - k / 2^24 + 0.5) / 2^31, g = -log(-log1p(-v)). For tests and tools.
uint32_t gumbel_noise_bits(uint64_t seed, int64_t position, int32_t token);

// The tokens of a sequence before the one being sampled: ids[0, prompt) its
// prompt's (repetition_penalty counts them), ids[prompt, size) generated
// (every penalty counts them). A caller may leave the prompt out (prompt 0)
// when the params do not repeat_prompt(). Empty: none.
struct History {
  const int32_t* ids = nullptr;
  size_t size = 0;
  size_t prompt = 0;
  History() = default;
  explicit History(const std::vector<int32_t>& v, size_t prompt_len = 0)
      : ids(v.data()), size(v.size()), prompt(prompt_len) {}
};

// Samples one token from `logits[0, vocab)` (raw, unscaled). `position` is the
// index in its sequence of the token being sampled (prompt_len for the first
// generated token). Order of operations: the logit adjustments, in float and
// in this order (core::SamplingParams; the row is copied first, `logits` is
// never written): each id's bias added; each id of `history` divided by
// repetition_penalty when positive, multiplied otherwise; each id generated
// c > 0 times less frequency_penalty * c + presence_penalty; then greedy
// if temperature == 0; else logits / temperature, keep the top_k most likely,
// keep the smallest prefix (in rank order) whose probability mass is >= top_p
// (at least one token), then take the argmax of logit / temperature +
// gumbel_noise over the kept ids (lowest id on an exact tie). When
// params.logprobs >= 0, `logprob` is the log-softmax of the raw logits (no
// adjustment, no temperature) at the chosen id and `top` holds the K most
// likely ids under the raw logits, most likely first; when it is -1,
// `logprob` is 0 and `top` empty. Throws std::invalid_argument on bad params,
// a logit_bias or history id outside [0, vocab), or vocab < 1, and
// std::runtime_error when the logits hold NaN or +inf, or are all -inf.
SampledToken sample(const float* logits, int64_t vocab, const SamplingParams& params, int64_t position,
                    History history = {});

// Scores token `id` under the raw `logits[0, vocab)`: its log-softmax, its
// 1-based rank (1 + the ids with a larger logit) and the top `n_top` ids
// (most likely first), as sample() gives a chosen token's logprobs. Throws
// std::invalid_argument on an id outside [0, vocab) or n_top outside [0,
// kMaxLogprobs], std::runtime_error on NaN or +inf logits or all -inf.
SampledToken score(const float* logits, int64_t vocab, int32_t id, int32_t n_top);
// score() of row r of `logits` [R, V] (copied to CPU fp32 once) for ids[r]
// with n_top[r] alternatives; rows in parallel.
std::vector<SampledToken> score_rows(const at::Tensor& logits, const std::vector<int32_t>& ids,
                                     const std::vector<int32_t>& n_top);

// Samples row r of `logits` [R, V] (any floating dtype, any device: copied to
// CPU fp32 once) with params[r] at positions[r], after history[r] (when
// `history` is empty, no row has one); rows run in parallel
// (at::parallel_for). All params are validated before any row is sampled.
std::vector<SampledToken> sample_rows(const at::Tensor& logits, const std::vector<SamplingParams>& params,
                                      const std::vector<int64_t>& positions,
                                      const std::vector<History>& history = {});

}  // namespace troupe::model
