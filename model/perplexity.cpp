#include "model/perplexity.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include <torch/types.h>

#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"

namespace troupe::model {
namespace {

constexpr int64_t kPerplexityBlock = 16;  // tokens per KV block of the one-window pool

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

namespace {

// The windows of `ids` chunk by chunk as the serving engine's forward takes
// them (forward_step over a paged pool of exactly one window, blocks in
// order: slot = position): fn(batch, a, b) for each chunk, whose rows
// batch.sample_rows score tokens [a + 1, b + 1) (none when a >= b: the chunk
// only fills the K/V). Fills the counters of `r` but its nll; returns the
// seconds taken.
template <class Fn>
double each_chunk(const std::vector<int32_t>& ids, const std::vector<PerplexityWindow>& windows,
                  const PerplexityOptions& o, PerplexityResult& r, const std::function<void(int64_t, int64_t)>& progress,
                  Fn fn) {
  at::NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t blocks = (o.context + kPerplexityBlock - 1) / kPerplexityBlock;
  const torch::Tensor table = torch::arange(blocks, torch::kInt).view({1, blocks});
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
      fn(batch, a, b);
      if (a < b) r.scored += b - a;
    }
    r.run += w.end - w.begin;
    ++r.windows;
    if (progress) progress(r.windows, static_cast<int64_t>(windows.size()));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// -log p(target) of each row: logits [n, V], targets ids[a + 1, b + 1).
torch::Tensor row_nll(const torch::Tensor& rows, const std::vector<int32_t>& ids, int64_t a, int64_t b) {
  const torch::Tensor targets =
      torch::tensor(std::vector<int64_t>(ids.begin() + a + 1, ids.begin() + b + 1), torch::kLong)
          .to(rows.device())
          .unsqueeze(1);
  return torch::logsumexp(rows, 1) - rows.gather(1, targets).squeeze(1);
}

std::vector<PerplexityWindow> checked_windows(const Gpt2& model, const std::vector<int32_t>& ids,
                                              const PerplexityOptions& o) {
  const int64_t n_positions = model.config().n_positions;
  if (o.context > n_positions)
    throw std::invalid_argument("--context " + std::to_string(o.context) + " is past the model's " +
                                std::to_string(n_positions) + " positions");
  return perplexity_windows(static_cast<int64_t>(ids.size()), o);
}

}  // namespace

PerplexityResult score_perplexity(const Gpt2& model, const std::vector<int32_t>& ids,
                                  const PerplexityOptions& options,
                                  const std::function<void(int64_t, int64_t)>& progress) {
  const PerplexityOptions o = with_defaults(options, model.config().n_positions);
  const std::vector<PerplexityWindow> windows = checked_windows(model, ids, o);
  // The serving engine's forward (its attention kernel, the LM head on the
  // requested rows only).
  PagedKvCache cache(model.config(), (o.context + kPerplexityBlock - 1) / kPerplexityBlock, kPerplexityBlock,
                     model.device(), o.kv_dtype);
  PerplexityResult r;
  r.seconds = each_chunk(ids, windows, o, r, progress, [&](const FlatBatch& batch, int64_t a, int64_t b) {
    const torch::Tensor rows = model.forward_step(batch, cache, PagedAttention::kAuto);
    if (a < b) r.nll += row_nll(rows, ids, a, b).to(torch::kDouble).sum().item<double>();
  });
  return r;
}

KlResult score_kl_divergence(const Gpt2& base, const Gpt2& model, const std::vector<int32_t>& ids,
                             const PerplexityOptions& options,
                             const std::function<void(int64_t, int64_t)>& progress) {
  if (base.config().n_positions != model.config().n_positions || base.config().vocab_size != model.config().vocab_size)
    throw std::invalid_argument("KL divergence: the two models differ in shape");
  const PerplexityOptions o = with_defaults(options, model.config().n_positions);
  const std::vector<PerplexityWindow> windows = checked_windows(model, ids, o);
  const int64_t blocks = (o.context + kPerplexityBlock - 1) / kPerplexityBlock;
  PagedKvCache base_cache(base.config(), blocks, kPerplexityBlock, base.device());
  PagedKvCache cache(model.config(), blocks, kPerplexityBlock, model.device(), o.kv_dtype);
  KlResult k;
  std::vector<double> kl;
  int64_t agree = 0;
  k.model.seconds = each_chunk(ids, windows, o, k.model, progress, [&](const FlatBatch& batch, int64_t a, int64_t b) {
    const torch::Tensor rb = base.forward_step(batch, base_cache, PagedAttention::kAuto).to(torch::kDouble);
    const torch::Tensor rm = model.forward_step(batch, cache, PagedAttention::kAuto).to(torch::kDouble);
    if (a >= b) return;
    const torch::Tensor lb = torch::log_softmax(rb, 1), lm = torch::log_softmax(rm, 1);
    // KL(P_base || P_model) per row, in nats.
    const torch::Tensor d = (lb.exp() * (lb - lm)).sum(1).contiguous();
    const double* dp = d.data_ptr<double>();
    kl.insert(kl.end(), dp, dp + d.numel());
    agree += rb.argmax(1).eq(rm.argmax(1)).sum().item<int64_t>();
    k.base.nll += row_nll(rb, ids, a, b).sum().item<double>();
    k.model.nll += row_nll(rm, ids, a, b).sum().item<double>();
  });
  k.base.scored = k.model.scored;
  k.base.run = k.model.run;
  k.base.windows = k.model.windows;
  k.base.seconds = k.model.seconds;
  if (!kl.empty()) {
    double sum = 0;
    for (double v : kl) sum += v;
    k.kl_mean = sum / static_cast<double>(kl.size());
    std::sort(kl.begin(), kl.end());
    k.kl_p99 = kl[std::min(kl.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(kl.size())))];
    k.kl_max = kl.back();
    k.top1 = static_cast<double>(agree) / static_cast<double>(kl.size());
  }
  return k;
}

}  // namespace troupe::model
