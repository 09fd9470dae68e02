#include "model/perplexity.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"

namespace troupe::model {
namespace {

void check(const PerplexityOptions& o) {
  if (o.context < 2) throw std::invalid_argument("--context must be >= 2, got " + std::to_string(o.context));
  if (o.stride < 1 || o.stride > o.context)
    throw std::invalid_argument("--stride must be in [1, context " + std::to_string(o.context) + "], got " +
                                std::to_string(o.stride));
  if (o.chunk < 1) throw std::invalid_argument("--batch must be >= 1, got " + std::to_string(o.chunk));
  if (o.score_second_half && o.stride != o.context)
    throw std::invalid_argument("--score-second-half places windows end to end: --stride must be --context or unset");
}

}  // namespace

PerplexityOptions with_defaults(PerplexityOptions o, int64_t n_positions) {
  if (o.context == 0) o.context = n_positions;
  if (o.stride == 0) o.stride = o.context;
  return o;
}

std::vector<PerplexityWindow> perplexity_windows(int64_t n_tokens, const PerplexityOptions& options) {
  const PerplexityOptions& o = options;
  check(o);
  std::vector<PerplexityWindow> out;
  if (o.score_second_half) {
    if (n_tokens < o.context)
      throw std::invalid_argument("the text has " + std::to_string(n_tokens) + " tokens; --score-second-half needs " +
                                  "at least one window of --context " + std::to_string(o.context));
    for (int64_t begin = 0; begin + o.context <= n_tokens; begin += o.context)
      out.push_back({begin, begin + o.context, begin + o.context / 2 + 1});
    return out;
  }
  if (n_tokens < 2) throw std::invalid_argument("the text must have at least 2 tokens to score one");
  int64_t scored_to = 1;  // the text's first token has nothing before it
  for (int64_t begin = 0; scored_to < n_tokens; begin += o.stride) {
    const int64_t end = std::min(begin + o.context, n_tokens);
    out.push_back({begin, end, std::max(scored_to, begin + 1)});
    scored_to = end;
  }
  return out;
}

double PerplexityResult::ppl() const { return std::exp(mean_nll()); }

void add_window(PerplexityResult& r, const PerplexityWindow& w, const std::vector<float>& logprobs) {
  if (static_cast<int64_t>(logprobs.size()) != w.end - w.begin - 1)
    throw std::invalid_argument("perplexity: a window of " + std::to_string(w.end - w.begin) + " tokens came back with " +
                                std::to_string(logprobs.size()) + " logprobs");
  for (int64_t p = w.score_from; p < w.end; ++p) r.nll -= static_cast<double>(logprobs[p - w.begin - 1]);
  r.scored += w.end - w.score_from;
  r.run += w.end - w.begin;
  ++r.windows;
}

PerplexityResult score_perplexity(const Gpt2& model, const std::vector<int32_t>& ids,
                                  const PerplexityOptions& options,
                                  const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t n_positions = model.config().n_positions;
  const PerplexityOptions o = with_defaults(options, n_positions);
  if (o.context > n_positions)
    throw std::invalid_argument("--context " + std::to_string(o.context) + " is past the model's " +
                                std::to_string(n_positions) + " positions");
  const std::vector<PerplexityWindow> windows = perplexity_windows(static_cast<int64_t>(ids.size()), o);
  torch::NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  // The serving engine's forward (forward_step over a paged cache: its
  // attention kernel, the LM head on the requested rows only), one window at a
  // time in a pool of exactly one window, blocks in order: slot = position.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (o.context + kBlock - 1) / kBlock;
  PagedKvCache cache(model.config(), blocks, kBlock, model.device());
  const torch::Tensor table = torch::arange(blocks, torch::kInt).view({1, blocks});
  PerplexityResult r;
  for (const PerplexityWindow& w : windows) {
    // Row p (the token at p) predicts the token at p + 1: rows
    // [score_from - 1, end - 1) score tokens [score_from, end).
    for (int64_t c0 = w.begin; c0 < w.end; c0 += o.chunk) {
      const int64_t c1 = std::min(c0 + o.chunk, w.end), T = c1 - c0, L0 = c0 - w.begin;
      const int64_t a = std::max(c0, w.score_from - 1), b = std::min(c1, w.end - 1);
      FlatBatch batch;
      batch.token_ids = torch::tensor(std::vector<int64_t>(ids.begin() + c0, ids.begin() + c1), torch::kLong);
      batch.positions = torch::arange(L0, L0 + T, torch::kLong);
      batch.slot_mapping = batch.positions;
      batch.query_start = {0, T};
      batch.context_lens = {L0 + T};
      batch.block_tables = table;
      for (int64_t p = a; p < b; ++p) batch.sample_rows.push_back(p - c0);
      if (batch.sample_rows.empty()) batch.sample_rows.push_back(T - 1);  // K/V only; its row goes unused
      const torch::Tensor rows = model.forward_step(batch, cache, PagedAttention::kAuto);
      if (a >= b) continue;
      const torch::Tensor targets =
          torch::tensor(std::vector<int64_t>(ids.begin() + a + 1, ids.begin() + b + 1), torch::kLong)
              .to(rows.device())
              .unsqueeze(1);
      const torch::Tensor nll = torch::logsumexp(rows, 1) - rows.gather(1, targets).squeeze(1);
      r.nll += nll.to(torch::kDouble).sum().item<double>();
      r.scored += b - a;
    }
    r.run += w.end - w.begin;
    ++r.windows;
    if (progress) progress(r.windows, static_cast<int64_t>(windows.size()));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace troupe::model
