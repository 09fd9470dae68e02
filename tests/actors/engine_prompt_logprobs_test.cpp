// Prompt logprobs through the real engine (scheduler + step executor + tiny
// random GPT-2): every position's logprob, rank and top-K equal a full
// no-cache forward's log_softmax, for prompts longer than one chunk, with a
// prefix the cache holds, and through a preemption.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <map>
#include <random>

#include "actors/engine.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/text/tokenizer.hpp"
#include "model/weights.hpp"
#include "test_utils.hpp"

namespace troupe::actors {
namespace {

struct Tiny {
  model::Gpt2Config cfg = model::Gpt2Config::preset("tiny");
  model::Gpt2 gpt{cfg, model::Gpt2Weights::random(cfg, 4242), torch::kCPU};
  model::Tokenizer tok = model::Tokenizer::from_dir(test::tokenizer_dir());
};

const Tiny& tiny() {
  static Tiny t;
  return t;
}

core::SchedulerOptions engine_options(int32_t num_blocks, int32_t budget) {
  core::SchedulerOptions so;
  so.num_blocks = num_blocks;
  so.block_size = 4;
  so.max_num_batched_tokens = budget;
  so.max_num_seqs = 8;
  so.max_model_len = tiny().cfg.n_positions;
  so.vocab_size = tiny().cfg.vocab_size;
  so.watermark = 0.0;
  return so;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> id(0, 50000);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = id(rng);
  return p;
}

core::Request scoring(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens, int32_t top) {
  core::Request r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.sampling.prompt_logprobs = top;
  r.seed = 7;
  r.ignore_eos = true;
  return r;
}

// Runs until idle; every request's prompt scores (positions 1..) in order.
struct Collected {
  std::map<uint64_t, std::vector<core::SampledToken>> scores;
  std::map<uint64_t, core::RequestEvent> finals;
  std::map<uint64_t, int> tokens;
};

void collect(Engine& engine, Collected& c) {
  engine.run_until_idle();
  for (auto& ev : engine.take_events()) {
    if (ev.kind == core::EventKind::kPromptLogprobs) {
      auto& s = c.scores[ev.request_id];
      ASSERT_EQ(ev.prompt_start, static_cast<int32_t>(s.size()) + 1) << "a gap or a repeat";
      ASSERT_EQ(c.tokens[ev.request_id], 0) << "prompt scores after a generated token";
      s.insert(s.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
    } else if (ev.kind == core::EventKind::kToken) {
      ++c.tokens[ev.request_id];
    } else if (ev.finished()) {
      c.finals[ev.request_id] = ev;
    }
  }
}

// Every position against log_softmax of a full no-cache forward.
void expect_matches_full_forward(const std::vector<int32_t>& prompt, const std::vector<core::SampledToken>& got,
                                 int32_t top) {
  ASSERT_EQ(got.size(), prompt.size() - 1);
  at::NoGradGuard no_grad;
  const torch::Tensor logits = tiny().gpt.forward_full(prompt);
  const torch::Tensor lsm = torch::log_softmax(logits.to(torch::kDouble), 1);
  for (size_t p = 1; p < prompt.size(); ++p) {
    const core::SampledToken& s = got[p - 1];
    const int64_t row = static_cast<int64_t>(p) - 1;
    ASSERT_EQ(s.id, prompt[p]) << "position " << p;
    EXPECT_NEAR(s.logprob, lsm[row][prompt[p]].item<double>(), 1e-4) << "position " << p;
    const float x = logits[row][prompt[p]].item<float>();
    const int64_t above = (logits[row] > x).sum().item<int64_t>();
    EXPECT_NEAR(s.rank, 1 + above, 1) << "position " << p << " (ties within float noise)";
    ASSERT_EQ(static_cast<int32_t>(s.top.size()), top) << "position " << p;
    const auto best = lsm[row].topk(top);
    for (int32_t k = 0; k < top; ++k) {
      EXPECT_NEAR(s.top[k].second, std::get<0>(best)[k].item<double>(), 1e-4) << "position " << p << " top " << k;
      EXPECT_NEAR(lsm[row][s.top[k].first].item<double>(), std::get<0>(best)[k].item<double>(), 1e-4);
    }
  }
}

TEST(EnginePromptLogprobs, EqualAFullForwardThroughChunksAndACachedPrefix) {
  std::mt19937 rng(31);
  model::PagedKvCache cache(tiny().cfg, 64, 4, torch::kCPU);
  Engine engine(tiny().gpt, cache, &tiny().tok, engine_options(64, 8), model::PagedAttention::kAuto);
  const auto a = random_prompt(rng, 37);  // 5 chunks of 8
  ASSERT_FALSE(engine.submit(scoring(1, a, 3, 3)));
  Collected c;
  collect(engine, c);
  expect_matches_full_forward(a, c.scores[1], 3);
  EXPECT_EQ(c.tokens[1], 3);

  // A prompt sharing a's first 24 tokens: the cache holds them, yet every
  // position is scored (its rows run again); a plain request after it hits.
  auto b = std::vector<int32_t>(a.begin(), a.begin() + 24);
  for (int32_t t : random_prompt(rng, 9)) b.push_back(t);
  ASSERT_FALSE(engine.submit(scoring(2, b, 0, 1)));
  collect(engine, c);
  expect_matches_full_forward(b, c.scores[2], 1);
  EXPECT_EQ(c.tokens[2], 0);
  EXPECT_EQ(c.finals[2].finish_reason, core::FinishReason::kLength);
  EXPECT_EQ(c.finals[2].usage.cached_tokens, 0);

  core::Request plain = scoring(3, b, 1, 0);
  plain.sampling.prompt_logprobs = -1;
  ASSERT_FALSE(engine.submit(plain));
  collect(engine, c);
  EXPECT_GE(c.finals[3].usage.cached_tokens, 24);
  EXPECT_TRUE(c.scores[3].empty());
}

TEST(EnginePromptLogprobs, EqualAFullForwardThroughAPreemption) {
  std::mt19937 rng(32);
  // 8 blocks of 4, and the first request needs all 8 in the end: its decodes
  // take the pool back from the scoring one, which is preempted mid-prompt
  // and recomputed.
  model::PagedKvCache cache(tiny().cfg, 8, 4, torch::kCPU);
  Engine engine(tiny().gpt, cache, &tiny().tok, engine_options(8, 6), model::PagedAttention::kAuto);
  core::Request first = scoring(1, random_prompt(rng, 24), 9, 0);
  first.sampling.prompt_logprobs = -1;
  ASSERT_FALSE(engine.submit(first));
  ASSERT_TRUE(engine.step());
  const auto p = random_prompt(rng, 20);
  ASSERT_FALSE(engine.submit(scoring(2, p, 2, 2)));
  Collected c;
  collect(engine, c);
  EXPECT_GT(engine.scheduler().stats().preemptions, 0) << "the test needs a preemption";
  expect_matches_full_forward(p, c.scores[2], 2);
  EXPECT_EQ(c.tokens[2], 2);
}

}  // namespace
}  // namespace troupe::actors
