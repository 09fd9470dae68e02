// The scheduler as the cluster uses it: priority-correct preemption, two steps
// in flight, failures that fail only their requests, requests moved between
// workers, and a prefix cache that a hash collision cannot fool.
#include <gtest/gtest.h>

#include <set>

#include "core/scheduler.hpp"
#include "scheduler_harness.hpp"

namespace troupe::core {
namespace {

using test::ChunkView;
using test::Harness;
using test::make_request;
using test::outputs;
using test::range_tokens;
using test::scripted;
using test::small_options;
using test::view;

// Ids that went from running back to waiting during one step.
std::set<uint64_t> preempted_by(Harness& h, const std::set<uint64_t>& ids) {
  std::set<uint64_t> running;
  for (uint64_t id : ids)
    if (h.sched.is_running(id)) running.insert(id);
  h.step();
  std::set<uint64_t> out;
  for (uint64_t id : running)
    if (h.sched.is_waiting(id)) out.insert(id);
  return out;
}

// The reproduction from the review: in a 4-block pool a high-priority request
// admitted after a low-priority one was preempted (twice) while the
// low-priority one ran to completion. The victim must be the running sequence
// with the largest (priority, arrival).
TEST(SchedulerPriority, PreemptsTheLeastImportantNotTheNewest) {
  SchedulerOptions o = small_options();
  o.num_blocks = 4;
  o.enable_prefix_caching = false;
  Harness h(o);
  Request low = make_request(1, range_tokens(4), 8);  // 4 + 7 slots: 3 blocks
  low.priority = 5;
  Request high = make_request(2, range_tokens(4, 40), 8);
  high.priority = 0;
  ASSERT_FALSE(h.submit(low));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 0, 4, true}}));
  ASSERT_FALSE(h.submit(high));  // arrives later, more important
  std::set<uint64_t> victims;
  for (int i = 0; i < 60 && h.sched.has_unfinished(); ++i) {
    for (uint64_t v : preempted_by(h, {1, 2})) victims.insert(v);
  }
  EXPECT_FALSE(h.sched.has_unfinished());
  EXPECT_EQ(victims, std::set<uint64_t>{1}) << "only the low-priority request may be preempted";
  EXPECT_GE(h.sched.stats().preemptions, 1);
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 4, 8));
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 4, 8));
}

TEST(SchedulerPriority, EqualPrioritiesPreemptTheNewest) {
  SchedulerOptions o = small_options();
  o.num_blocks = 4;
  o.enable_prefix_caching = false;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(4), 8)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(4, 40), 8)));
  std::set<uint64_t> victims;
  for (int i = 0; i < 60 && h.sched.has_unfinished(); ++i) {
    for (uint64_t v : preempted_by(h, {1, 2})) victims.insert(v);
  }
  EXPECT_EQ(victims, std::set<uint64_t>{2});
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 4, 8));
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 4, 8));
}

TEST(SchedulerAsync, SecondStepIsPlannedBeforeTheFirstReturns) {
  SchedulerOptions o = small_options();
  o.max_steps_in_flight = 2;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(5), 4)));
  auto p1 = h.plan_and_run();
  EXPECT_EQ(view(p1), (std::vector<ChunkView>{{1, 0, 5, true}}));
  ASSERT_TRUE(h.sched.can_schedule());
  // The token at position 5 is not known here yet; the worker feeds its own.
  auto p2 = h.plan_and_run();
  EXPECT_EQ(view(p2), (std::vector<ChunkView>{{1, 5, 1, true}}));
  EXPECT_TRUE(p2.new_seqs.empty());
  EXPECT_EQ(h.last.chunks.at(0).token_ids, (std::vector<int32_t>{h.script(1, 5)}));
  EXPECT_FALSE(h.sched.can_schedule());
  EXPECT_THROW(h.sched.schedule(), std::logic_error);
  h.deliver();
  auto p3 = h.plan_and_run();
  EXPECT_EQ(view(p3), (std::vector<ChunkView>{{1, 6, 1, true}}));
  h.deliver();
  // Two tokens received, two in flight: max_tokens = 4 leaves nothing to plan.
  EXPECT_TRUE(h.sched.can_schedule());
  auto p4 = h.plan_and_run();
  EXPECT_EQ(view(p4), (std::vector<ChunkView>{{1, 7, 1, true}}));
  h.deliver();
  EXPECT_TRUE(h.plan_and_run().empty()) << "the 4th token is in flight: no 5th";
  h.deliver();
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 5, 4));
  EXPECT_FALSE(h.sched.has_unfinished());
}

TEST(SchedulerAsync, TwoInFlightGiveTheSameTokensInFewerRoundTrips) {
  auto run = [](int32_t in_flight) {
    SchedulerOptions o = small_options();
    o.num_blocks = 20;
    o.max_steps_in_flight = in_flight;
    o.max_num_batched_tokens = 16;
    Harness h(o);
    for (uint64_t id = 1; id <= 6; ++id) {
      EXPECT_FALSE(h.submit(make_request(id, range_tokens(3 + static_cast<int32_t>(id) * 3, 100 * id), 12)));
    }
    h.run_until_idle();
    std::vector<std::vector<int32_t>> out;
    for (uint64_t id = 1; id <= 6; ++id) {
      EXPECT_EQ(outputs(h, id), scripted(h, id, 3 + static_cast<int32_t>(id) * 3, 12)) << id;
      out.push_back(outputs(h, id));
    }
    EXPECT_GT(h.sched.stats().preemptions, 0) << "the pool is meant to run out";
    return out;
  };
  EXPECT_EQ(run(1), run(2));
}

TEST(SchedulerAsync, TokensPastEosAreDropped) {
  SchedulerOptions o = small_options();
  o.max_steps_in_flight = 2;
  Harness h(o);
  h.script = [](uint64_t, int32_t pos) { return pos == 6 ? 50256 : pos; };
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(4), 10)));
  h.run_until_idle();
  const RequestEvent* f = h.final_event(1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, FinishReason::kEos);
  EXPECT_EQ(f->output_ids, (std::vector<int32_t>{4, 5, 50256}));
  EXPECT_EQ(h.token_events(1), f->output_ids) << "the step planned past eos brought a token that was dropped";
  EXPECT_GE(h.sched.stats().tokens_scheduled, 4 + 3);
}

TEST(SchedulerFailure, AFailedStepIsRetriedOnceThenItsRequestsFail) {
  SchedulerOptions o = small_options();
  Harness h(o);
  h.expect_worker_failures = true;
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(5), 6)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(5, 30), 6)));
  h.step();
  h.fail_next_step = true;  // the forward pass throws (e.g. out of memory)
  h.step();
  EXPECT_TRUE(h.sched.is_waiting(1));
  EXPECT_TRUE(h.sched.is_waiting(2));
  EXPECT_EQ(h.sched.stats().failed_steps, 1);
  EXPECT_EQ(h.sched.stats().retries, 2);
  h.step();  // both come back (recompute) and go on
  EXPECT_TRUE(h.sched.is_running(1));
  h.fail_next_step = true;  // a second failure of the same requests ends them
  h.step();
  for (uint64_t id : {1, 2}) {
    const RequestEvent* f = h.final_event(id);
    ASSERT_NE(f, nullptr) << id;
    EXPECT_EQ(f->finish_reason, FinishReason::kError);
    EXPECT_STREQ(to_string(f->finish_reason), "error");
    EXPECT_NE(f->error.find("forward pass failed"), std::string::npos) << f->error;
    EXPECT_EQ(f->output_ids, scripted(h, id, 5, static_cast<int32_t>(f->output_ids.size())));
  }
  // The scheduler is not stuck: the next request runs normally.
  ASSERT_FALSE(h.submit(make_request(3, range_tokens(4, 60), 3)));
  h.run_until_idle();
  EXPECT_EQ(outputs(h, 3), scripted(h, 3, 4, 3));
  EXPECT_EQ(h.sched.stats().blocks_used, 0);
}

TEST(SchedulerFailure, AFailedWorkItemFailsOnlyItsRequest) {
  SchedulerOptions o = small_options();
  o.max_steps_in_flight = 2;
  Harness h(o);
  h.expect_worker_failures = true;
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_FALSE(h.submit(make_request(id, range_tokens(4, 10 * id), 8)));
  h.step();
  h.fail_seqs_next = {2};  // e.g. NaN logits in its row
  h.fail_retryable = false;
  h.run_until_idle();
  const RequestEvent* f2 = h.final_event(2);
  ASSERT_NE(f2, nullptr);
  EXPECT_EQ(f2->finish_reason, FinishReason::kError);
  EXPECT_NE(f2->error.find("seq 2"), std::string::npos) << f2->error;
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 4, 8));
  EXPECT_EQ(outputs(h, 3), scripted(h, 3, 4, 8));
  EXPECT_FALSE(h.worker.contains(2)) << "the worker forgot the failed sequence";
}

TEST(SchedulerFailure, ARetryableWorkItemFailureRecomputes) {
  Harness h(small_options());
  h.expect_worker_failures = true;
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(6), 6)));
  h.step();
  h.step();
  h.fail_seqs_next = {1};
  h.fail_retryable = true;  // the worker lost its state, not the request's fault
  h.step();
  EXPECT_TRUE(h.sched.is_waiting(1));
  h.run_until_idle();
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 6, 6));
  EXPECT_EQ(h.token_events(1), outputs(h, 1)) << "nothing repeated or lost";
}

TEST(SchedulerMove, ARequestContinuesOnAnotherWorkerWithNothingRepeatedOrLost) {
  SchedulerOptions o = small_options();
  o.max_steps_in_flight = 2;
  Harness a(o), b(o);
  ASSERT_FALSE(a.submit(make_request(7, range_tokens(9), 12)));
  for (int i = 0; i < 4; ++i) {  // prefill and decodes, two in flight when it moves
    a.plan_and_run();
    if (!a.sched.can_schedule()) a.deliver();
  }
  a.plan_and_run();
  ASSERT_EQ(a.sched.steps_in_flight(), 2);
  auto moved = a.sched.extract(7);
  ASSERT_TRUE(moved.has_value());
  EXPECT_FALSE(a.sched.has_unfinished());
  while (!a.results.empty()) a.deliver();  // late results for the moved request are ignored
  EXPECT_EQ(a.final_event(7), nullptr);
  const auto before = a.token_events(7);
  EXPECT_EQ(moved->prompt_ids, range_tokens(9));
  EXPECT_EQ(moved->output_ids, before);
  ASSERT_TRUE(moved->seed.has_value());
  ASSERT_FALSE(b.resubmit(*moved));
  b.run_until_idle();
  const RequestEvent* f = b.final_event(7);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->output_ids, scripted(b, 7, 9, 12)) << "the whole output, moved part included";
  auto all = before;
  const auto after = b.token_events(7);
  all.insert(all.end(), after.begin(), after.end());
  EXPECT_EQ(all, f->output_ids) << "the two workers' token events join without gaps or repeats";
  EXPECT_EQ(f->usage.prompt_tokens, 9);
  EXPECT_EQ(f->usage.completion_tokens, 12);
  // The old worker was told to forget it.
  a.plan_and_run();
  EXPECT_EQ(a.sched.allocator().num_used(), 0);
}

// The scheduler-level form of the prefix-cache collision: with names that
// only look at a block's last token, an attacker's block computed after
// [9, 5] would be served to a victim's [1, 5] prefix by a lookup that trusts
// names. The shadow KV of the harness fails the test on any wrong read.
TEST(SchedulerPrefix, ACollidingNameNeverServesAnotherPrefixesKv) {
  SchedulerOptions o = small_options();
  o.block_size = 2;
  Harness h(o);
  h.sched.allocator_for_testing().set_hash_function(
      [](uint64_t, uint64_t, const int32_t* t, int32_t n) { return static_cast<uint64_t>(t[n - 1]); });
  ASSERT_FALSE(h.submit(make_request(1, {1, 5, 3}, 1)));  // caches [1, 5]
  h.run_until_idle();
  ASSERT_FALSE(h.submit(make_request(2, {9, 5, 2, 7, 4}, 1)));  // [9, 5] collides; [2, 7] after it
  h.run_until_idle();
  ASSERT_FALSE(h.submit(make_request(3, {1, 5, 2, 7, 6}, 2)));
  h.step();
  EXPECT_EQ(h.last.chunks.at(0).start_pos, 2) << "only [1, 5] is a true prefix hit";
  h.run_until_idle();
  EXPECT_EQ(outputs(h, 3), scripted(h, 3, 5, 2));
  EXPECT_EQ(h.final_event(3)->usage.cached_tokens, 2);
}

TEST(SchedulerPrefix, CachedPrefixBlocksAnswersPlacement) {
  Harness h(small_options());
  const auto prompt = range_tokens(13, 200);
  EXPECT_EQ(h.sched.cached_prefix_blocks(prompt), 0);
  ASSERT_FALSE(h.submit(make_request(1, prompt, 1)));
  h.run_until_idle();
  EXPECT_EQ(h.sched.cached_prefix_blocks(prompt), 3);
  auto longer = prompt;
  longer.insert(longer.end(), {1, 2, 3, 4});
  EXPECT_EQ(h.sched.cached_prefix_blocks(longer), 3);
  EXPECT_EQ(h.sched.cached_prefix_blocks(range_tokens(13, 201)), 0);
}

}  // namespace
}  // namespace troupe::core
