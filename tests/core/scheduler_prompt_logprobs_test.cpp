// Prompt logprobs in the scheduler: every prompt position after the first is
// scored exactly once, in order, before the first generated token, through
// chunked prefill, a prefix the cache holds, preemption, a move to another
// worker, and a request that generates nothing (max_tokens 0).
#include <gtest/gtest.h>

#include "scheduler_harness.hpp"

namespace troupe::core::test {
namespace {

SchedulerOptions options(int32_t num_blocks, int32_t budget) {
  SchedulerOptions o;
  o.num_blocks = num_blocks;
  o.block_size = 4;
  o.max_num_batched_tokens = budget;
  o.max_model_len = 128;
  o.watermark = 0.0;
  return o;
}

Request scoring(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens, int32_t top = 2) {
  Request r = make_request(id, std::move(prompt), max_tokens);
  r.sampling.prompt_logprobs = top;
  r.ignore_eos = true;
  return r;
}

// (position, the prompt's token there) for positions 1 .. n - 1.
std::vector<std::pair<int32_t, int32_t>> every_position(const std::vector<int32_t>& prompt) {
  std::vector<std::pair<int32_t, int32_t>> v;
  for (size_t p = 1; p < prompt.size(); ++p) v.emplace_back(static_cast<int32_t>(p), prompt[p]);
  return v;
}

TEST(SchedulerPromptLogprobs, AChunkedPromptIsScoredOnceInOrderBeforeItsFirstToken) {
  Harness h(options(64, 8));
  const auto prompt = range_tokens(30, 100);
  ASSERT_FALSE(h.submit(scoring(1, prompt, 3)));
  int64_t score_rows = 0, steps = 0;
  while (h.sched.has_unfinished()) {
    const StepPlan plan = h.step();
    ASSERT_FALSE(plan.empty());
    for (const auto& w : plan.work) score_rows += w.score_rows;
    ++steps;
  }
  EXPECT_GE(steps, 4) << "30 tokens at 8 per step take several chunks";
  EXPECT_EQ(score_rows, 29) << "the plans tell the cost model every LM-head row";
  EXPECT_EQ(h.prompt_scores[1], every_position(prompt));
  EXPECT_EQ(h.token_events(1).size(), 3u);
  EXPECT_EQ(h.final_event(1)->finish_reason, FinishReason::kLength);
}

TEST(SchedulerPromptLogprobs, MaxTokensZeroScoresThePromptAndGeneratesNothing) {
  Harness h(options(64, 8));
  const auto prompt = range_tokens(13, 7);
  ASSERT_FALSE(h.submit(scoring(1, prompt, 0, 0)));
  ASSERT_FALSE(h.submit(scoring(2, {42}, 0, 0)));  // one token: nothing to score, still a clean finish
  h.run_until_idle();
  EXPECT_EQ(h.prompt_scores[1], every_position(prompt));
  EXPECT_TRUE(h.prompt_scores[2].empty());
  for (uint64_t id : {1u, 2u}) {
    ASSERT_NE(h.final_event(id), nullptr);
    EXPECT_EQ(h.final_event(id)->finish_reason, FinishReason::kLength);
    EXPECT_TRUE(h.final_event(id)->output_ids.empty());
    EXPECT_TRUE(h.token_events(id).empty());
  }
  EXPECT_EQ(h.final_event(1)->usage.prompt_tokens, 13);
  EXPECT_EQ(h.sched.stats().tokens_generated, 0);
  // A prompt may use every position when nothing is generated.
  ASSERT_FALSE(h.submit(scoring(3, range_tokens(128, 1), 0, 0)));
  h.run_until_idle();
  EXPECT_EQ(h.prompt_scores[3].size(), 127u);
  // Without prompt logprobs, max_tokens 0 asks for nothing.
  auto err = h.sched.check(make_request(4, {1, 2}, 0));
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("max_tokens"), std::string::npos) << *err;
  Request bad = scoring(5, {1, 2, 3}, 1);
  bad.prompt_scored = 3;
  EXPECT_TRUE(h.sched.check(bad)) << "prompt_scored past the prompt";
}

TEST(SchedulerPromptLogprobs, AScoringRequestTakesNoPrefixHitButOffersItsBlocks) {
  Harness h(options(64, 64));
  const auto prefix = range_tokens(16, 500);
  auto with_tail = [&](int32_t tail) {
    auto p = prefix;
    for (int32_t i = 0; i < 5; ++i) p.push_back(tail + i);
    return p;
  };
  ASSERT_FALSE(h.submit(make_request(1, with_tail(1000), 1)));
  h.run_until_idle();
  EXPECT_EQ(h.events[1].front().usage.cached_tokens, 0);

  const auto scored = with_tail(2000);
  ASSERT_FALSE(h.submit(scoring(2, scored, 1)));
  h.run_until_idle();
  EXPECT_EQ(h.events[2].front().usage.cached_tokens, 0) << "its prompt rows must run for their logits";
  EXPECT_EQ(h.prompt_scores[2], every_position(scored));

  ASSERT_FALSE(h.submit(make_request(3, with_tail(3000), 1)));
  h.run_until_idle();
  EXPECT_EQ(h.events[3].front().usage.cached_tokens, 16) << "the shared prefix is still served from the cache";
}

TEST(SchedulerPromptLogprobs, APreemptedScoringRequestIsScoredOnce) {
  // 8 blocks of 4, and the first request needs all 8 in the end: its decodes
  // take the pool back from the scoring one (the newest running sequence),
  // which is preempted mid-prompt and recomputed once the first is done.
  Harness h(options(8, 6));
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(24, 1), 9)));
  h.step();
  const auto prompt = range_tokens(20, 300);
  ASSERT_FALSE(h.submit(scoring(2, prompt, 2)));
  h.run_until_idle();
  EXPECT_GT(h.sched.stats().preemptions, 0) << "the test needs a preemption";
  EXPECT_EQ(h.prompt_scores[2], every_position(prompt));
  EXPECT_EQ(h.token_events(2).size(), 2u);
  EXPECT_EQ(h.token_events(1).size(), 9u);
}

TEST(SchedulerPromptLogprobs, AMovedRequestIsNotScoredAgain) {
  Harness from(options(64, 4)), to(options(64, 4));
  const auto prompt = range_tokens(18, 40);
  ASSERT_FALSE(from.submit(scoring(7, prompt, 2)));
  from.step();
  from.step();
  std::optional<Request> moved = from.sched.extract(7);
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->prompt_scored, 8) << "two chunks of 4 rows scored positions 1..8";
  // The receiving side continues the stream where the first left it.
  to.prompt_scores[7] = from.prompt_scores[7];
  to.tokens_at_submit[7] = prompt.size();
  ASSERT_FALSE(to.resubmit(*moved));
  to.run_until_idle();
  EXPECT_EQ(to.prompt_scores[7], every_position(prompt));
  EXPECT_EQ(to.token_events(7).size(), 2u);
}

TEST(SchedulerPromptLogprobs, AResultWithoutTheScoresItOwesIsRefused) {
  Harness h(options(64, 8));
  ASSERT_FALSE(h.submit(scoring(1, range_tokens(12, 60), 1)));
  h.drop_prompt_scores_next = true;
  h.plan_and_run();
  StepResult r = h.results.front();
  EXPECT_THROW(h.sched.on_step_done(r), std::invalid_argument);
  // The same result with a score naming another token than the prompt's.
  PromptScores p;
  p.seq_id = 1;
  p.start = 1;
  for (int32_t i = 0; i < 8; ++i) p.tokens.push_back({i == 3 ? 9999 : 61 + i, Harness::prompt_logprob(1 + i), {}, 1});
  r.prompt_scores = {p};
  EXPECT_THROW(h.sched.on_step_done(r), std::invalid_argument);
  // ... and one for a sequence not in the step.
  p.seq_id = 2;
  r.prompt_scores = {p};
  EXPECT_THROW(h.sched.on_step_done(r), std::invalid_argument);
  // Nothing changed: the right scores are taken.
  p.seq_id = 1;
  p.tokens[3].id = 64;
  r.prompt_scores = {p};
  EXPECT_NO_THROW(h.sched.on_step_done(r));
  h.results.clear();
  h.drain();
  h.sched.check_invariants();
}

}  // namespace
}  // namespace troupe::core::test
