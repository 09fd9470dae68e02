#pragma once
// Perplexity of a text under the model (`troupe perplexity`): the text's
// tokens cut into windows of at most `context` tokens, each window run
// through the model once (the serving engine's forward over a paged cache,
// in prefill chunks of `chunk` rows, the LM head on the rows that score),
// and each token scored by the log-probability the row before it gives it. Two ways to place the windows:
//
//  * sliding (Hugging Face's `stride` method, the default): windows start
//    every `stride` tokens; each scores only the tokens no earlier window
//    scored, with up to context - stride tokens of context before the first
//    it scores. With stride < context every token but the text's first is
//    scored once; with stride = context (windows end to end) a window's
//    first token has nothing before it and is not scored;
//  * second half (llama.cpp's `llama-perplexity`): windows of exactly
//    `context` tokens end to end (a partial last one is dropped), each
//    scoring its tokens from context / 2 + 1 on, every one with at least
//    half a window of context.
//
// PPL = exp(mean NLL), the NLL in nats.
#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::model {

class Gpt2;
enum class KvDtype;  // paged_kv_cache.hpp

struct PerplexityOptions {
  int64_t context = 0;             // tokens per window; 0 = the model's n_positions
  int64_t stride = 0;              // sliding: a window every `stride` tokens; 0 = context
  // Rows per forward call. Its logits (chunk x vocab floats: 25.7 MB at 128
  // for GPT-2) stay under the heap's 32 MiB mmap threshold (core/heap_pages.hpp):
  // a larger block is mapped afresh for every chunk, and its page faults
  // halved the speed at 192 rows and more (Zen 5, 2026-12-04).
  int64_t chunk = 128;
  bool score_second_half = false;  // llama.cpp's windows instead of sliding ones
  KvDtype kv_dtype{};              // the KV cache's storage (float32); KL's reference keeps float32
};

// `options` with its defaults filled in: context 0 = n_positions, stride 0 = context.
PerplexityOptions with_defaults(PerplexityOptions options, int64_t n_positions);

// One window: tokens [begin, end) run; tokens [score_from, end) scored.
struct PerplexityWindow {
  int64_t begin = 0, end = 0, score_from = 0;
};

// The windows over a text of n_tokens tokens. Throws std::invalid_argument
// for a context < 2, a stride outside [1, context], a chunk < 1, or (second
// half) a stride other than the context or a text shorter than one window.
std::vector<PerplexityWindow> perplexity_windows(int64_t n_tokens, const PerplexityOptions& options);

struct PerplexityResult {
  double nll = 0;      // sum over scored tokens of -log p(token | the window's tokens before it), nats
  int64_t scored = 0;  // tokens scored
  int64_t run = 0;     // tokens run through the model (windows overlap when stride < context)
  int64_t windows = 0;
  double seconds = 0;  // wall time of the forward passes and the scoring
  double mean_nll() const { return scored > 0 ? nll / static_cast<double>(scored) : 0.0; }
  double ppl() const;  // exp(mean_nll())
};

// Adds one window scored elsewhere (a server's prompt logprobs): logprobs[i]
// is the logprob of the window's token begin + i + 1 given those before it.
// Throws std::invalid_argument unless it holds end - begin - 1 of them.
void add_window(PerplexityResult& result, const PerplexityWindow& window, const std::vector<float>& logprobs);

// Scores `ids` with `model` (its own device). `progress(windows done,
// windows)` after each window, if given. The options are checked as
// perplexity_windows does, and the context against the model's positions.
PerplexityResult score_perplexity(const Gpt2& model, const std::vector<int32_t>& ids,
                                  const PerplexityOptions& options,
                                  const std::function<void(int64_t, int64_t)>& progress = {});

// How far `model` (say bfloat16 weights) is from `base` (the fp32 model) on
// a text, as llama-perplexity --kl-divergence reports it: per scored token,
// KL(P_base || P_model) of the next-token distributions, and whether their
// most likely tokens agree.
struct KlResult {
  double kl_mean = 0, kl_p99 = 0, kl_max = 0;  // nats
  double top1 = 0;                             // fraction of scored tokens with the same argmax
  PerplexityResult base, model;                // each model's perplexity on the same windows
};

// Runs both models over the same windows (each with its own paged pool).
// Throws std::invalid_argument as score_perplexity does, or when the
// models' shapes differ.
KlResult score_kl_divergence(const Gpt2& base, const Gpt2& model, const std::vector<int32_t>& ids,
                             const PerplexityOptions& options,
                             const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace troupe::model
