#include "model/perplexity.hpp"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/gpt2.hpp"
#include "model/text/tokenizer.hpp"
#include "model/weights.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

PerplexityOptions opts(int64_t context, int64_t stride, bool second_half = false, int64_t chunk = 512) {
  PerplexityOptions o;
  o.context = context;
  o.stride = stride;
  o.chunk = chunk;
  o.score_second_half = second_half;
  return o;
}

std::vector<std::vector<int64_t>> as_rows(const std::vector<PerplexityWindow>& ws) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& w : ws) out.push_back({w.begin, w.end, w.score_from});
  return out;
}

TEST(PerplexityWindows, SlidingScoresEveryTokenButTheFirstOnce) {
  // Hugging Face's loop: begin 0, 2, 4, 6; each scores from where the last stopped.
  EXPECT_EQ(as_rows(perplexity_windows(10, opts(4, 2))),
            (std::vector<std::vector<int64_t>>{{0, 4, 1}, {2, 6, 4}, {4, 8, 6}, {6, 10, 8}}));
  // End to end: a window's first token has no row before it.
  EXPECT_EQ(as_rows(perplexity_windows(10, opts(4, 4))),
            (std::vector<std::vector<int64_t>>{{0, 4, 1}, {4, 8, 5}, {8, 10, 9}}));
  // A text shorter than one window: one window, every token but the first.
  EXPECT_EQ(as_rows(perplexity_windows(3, opts(8, 8))), (std::vector<std::vector<int64_t>>{{0, 3, 1}}));
}

TEST(PerplexityWindows, SecondHalfIsLlamaCppsConvention) {
  // llama-perplexity -c 4: chunks of 4 end to end (the partial last dropped);
  // rows n_ctx/2 .. n_ctx-2 score tokens n_ctx/2+1 .. n_ctx-1.
  EXPECT_EQ(as_rows(perplexity_windows(10, opts(4, 4, true))),
            (std::vector<std::vector<int64_t>>{{0, 4, 3}, {4, 8, 7}}));
  EXPECT_EQ(as_rows(perplexity_windows(16, opts(8, 8, true))),
            (std::vector<std::vector<int64_t>>{{0, 8, 5}, {8, 16, 13}}));
}

TEST(PerplexityWindows, BadOptionsAreNamed) {
  auto message = [](int64_t n, PerplexityOptions o) {
    try {
      perplexity_windows(n, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(10, opts(1, 1)).find("--context must be >= 2"), std::string::npos);
  EXPECT_NE(message(10, opts(4, 5)).find("--stride must be in [1, context 4]"), std::string::npos);
  EXPECT_NE(message(10, opts(4, 4, false, 0)).find("--batch must be >= 1"), std::string::npos);
  EXPECT_NE(message(3, opts(4, 4, true)).find("needs at least one window"), std::string::npos);
  EXPECT_NE(message(10, opts(4, 2, true)).find("--stride must be --context or unset"), std::string::npos);
  EXPECT_NE(message(1, opts(4, 4)).find("at least 2 tokens"), std::string::npos);
}

struct Tiny {
  Gpt2Config cfg = Gpt2Config::preset("tiny");
  Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  std::unique_ptr<Gpt2> model = std::make_unique<Gpt2>(cfg, Gpt2Weights::random(cfg, 1234), torch::kCPU);
};
const Tiny& tiny() {
  static Tiny t;
  return t;
}

std::vector<int32_t> some_text_ids() {
  std::string text;
  for (int i = 0; i < 12; ++i)
    text += "The quick brown fox " + std::to_string(i) + " jumps over the lazy dog; naïve café, 東京. ";
  return tiny().tok.encode(text);
}

// The reference: each window whole through the O(N^2) no-cache forward, its
// log_softmax in double, summed over the tokens the window scores.
double reference_nll(const std::vector<int32_t>& ids, const PerplexityOptions& o, int64_t* scored) {
  double nll = 0;
  *scored = 0;
  for (const PerplexityWindow& w : perplexity_windows(static_cast<int64_t>(ids.size()), o)) {
    const std::vector<int32_t> window(ids.begin() + w.begin, ids.begin() + w.end);
    const torch::Tensor lp = torch::log_softmax(tiny().model->forward_full(window).to(torch::kDouble), 1);
    for (int64_t t = w.score_from; t < w.end; ++t) {
      nll -= lp[t - 1 - w.begin][ids[static_cast<size_t>(t)]].item<double>();
      ++*scored;
    }
  }
  return nll;
}

TEST(Perplexity, MatchesAFullForwardPerWindowThroughChunks) {
  const std::vector<int32_t> ids = some_text_ids();
  ASSERT_GT(ids.size(), 200u);
  for (const PerplexityOptions& o : {opts(64, 32, false, 7), opts(64, 64, false, 64), opts(128, 128, false, 50),
                                     opts(48, 48, true, 5), opts(100, 60, false, 512)}) {
    int64_t scored = 0;
    const double ref = reference_nll(ids, o, &scored);
    const PerplexityResult r = score_perplexity(*tiny().model, ids, o);
    EXPECT_EQ(r.scored, scored) << o.context << "/" << o.stride;
    EXPECT_NEAR(r.nll, ref, 1e-5 * ref) << o.context << "/" << o.stride << " chunk " << o.chunk;
    EXPECT_NEAR(r.ppl(), std::exp(ref / static_cast<double>(scored)), 1e-5 * r.ppl());
  }
}

TEST(Perplexity, SlidingWindowsScoreEachTokenOnceAndReportProgress) {
  const std::vector<int32_t> ids = some_text_ids();
  int64_t last_done = 0, calls = 0, total_seen = 0;
  const PerplexityResult r = score_perplexity(*tiny().model, ids, opts(64, 16), [&](int64_t done, int64_t total) {
    EXPECT_EQ(done, last_done + 1);
    last_done = done;
    total_seen = total;
    ++calls;
  });
  EXPECT_EQ(r.scored, static_cast<int64_t>(ids.size()) - 1);
  EXPECT_EQ(calls, r.windows);
  EXPECT_EQ(total_seen, r.windows);
  EXPECT_GT(r.run, r.scored) << "overlapping windows run tokens twice";
  EXPECT_GT(r.ppl(), 1.0);
}

TEST(Perplexity, AContextPastTheModelIsRefused) {
  const std::vector<int32_t> ids = some_text_ids();
  EXPECT_THROW(score_perplexity(*tiny().model, ids, opts(tiny().cfg.n_positions + 1, 8)), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::model
