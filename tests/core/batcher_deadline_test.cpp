// Step deadlines (core::Batcher::take_hung): a worker whose oldest step runs
// past its deadline is hung: fenced (what it sends later is dropped) and its
// requests finish on the others with nothing lost or repeated. The deadline
// follows the worker's cost model, with a floor and a cold allowance.
#include <gtest/gtest.h>

#include <memory>

#include "batcher_harness.hpp"

namespace troupe::core {
namespace {

using test::Cluster;
using test::make_request;
using test::range_tokens;
using test::worker_options;

constexpr int64_t kMs = 1'000'000;

// Every plan is predicted to cost `ns` (0 = no prediction); what the worker
// reported is recorded.
struct FixedCost : StepCostModel {
  int64_t ns = 0;
  std::vector<std::pair<uint64_t, double>> observed;
  int64_t predict_ns(const StepPlan&) override { return ns; }
  void observe(uint64_t step_id, double forward_ms) override { observed.emplace_back(step_id, forward_ms); }
};

BatcherOptions deadlines(int64_t floor_ms, int64_t cold_ms = 0, double margin = 8) {
  BatcherOptions o;
  o.placement = PlacementPolicy::kRoundRobin;
  o.step_timeout_floor_ns = floor_ms * kMs;
  o.step_timeout_cold_ns = cold_ms * kMs;
  o.step_timeout_margin = margin;
  return o;
}

TEST(BatcherDeadlines, AWorkerPastItsDeadlineIsHungAndItsRequestsFinishElsewhere) {
  Cluster c(deadlines(5));
  c.add(1);
  c.add(2);
  for (uint64_t id = 1; id <= 4; ++id)
    ASSERT_FALSE(c.b.submit(make_request(id, range_tokens(5, 10 * id), 12), c.now));
  for (int i = 0; i < 3; ++i) c.round();  // a few tokens each, well inside the deadlines
  EXPECT_TRUE(c.b.take_hung(c.now).empty());

  c.frozen.insert(2);  // worker 2 stops answering: its step runs on and on; worker 1 goes on
  c.tick = kMs;
  const int64_t frozen_at = c.now;
  std::vector<HungWorker> hung;
  while (hung.empty() && c.now < frozen_at + 20 * kMs) {
    c.round();
    hung = c.b.take_hung(c.now);
    if (c.now < frozen_at + 5 * kMs) {
      EXPECT_TRUE(hung.empty()) << "under the 5 ms floor";
    }
  }
  ASSERT_EQ(hung.size(), 1u);
  EXPECT_EQ(hung[0].worker, 2u);
  EXPECT_EQ(hung[0].deadline_ns, 5 * kMs);
  EXPECT_GT(hung[0].running_ns, 5 * kMs);
  EXPECT_GT(hung[0].step_id, 0u);
  EXPECT_FALSE(c.b.has_worker(2));
  const BatcherCounters& k = c.b.counters();
  EXPECT_EQ(k.workers_hung, 1);
  EXPECT_EQ(k.workers_lost, 0);
  EXPECT_EQ(k.requests_moved, 2);
  EXPECT_GT(k.tokens_recomputed, 2 * 5);  // their prompts and the tokens they had
  for (uint64_t id : {2u, 4u}) EXPECT_EQ(c.b.worker_of(id), 1u);

  // Fenced: what it sends when it wakes up changes nothing.
  auto late = std::move(c.pending[2]);
  c.pending.erase(2);
  c.tables.erase(2);
  for (const StepResult& r : late) EXPECT_FALSE(c.b.on_result(2, r, c.now));
  c.drain();
  c.run();
  for (uint64_t id = 1; id <= 4; ++id) {
    ASSERT_EQ(c.finals[id].size(), 1u) << id;
    EXPECT_EQ(c.tokens[id], c.expected(id, 5, 12)) << "request " << id << ": nothing lost or repeated";
  }
}

// A worker making steady progress is never hung, however long it runs in
// all: the clock starts again each time its oldest step changes.
TEST(BatcherDeadlines, SteadyProgressIsNeverHung) {
  Cluster c(deadlines(5));
  c.tick = 4 * kMs;  // each round: 4 ms, under the floor
  c.add(1);
  ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(5), 40), c.now));
  for (int i = 0; i < 60 && c.b.has_unfinished(); ++i) {
    c.round();
    EXPECT_TRUE(c.b.take_hung(c.now).empty()) << "round " << i;
  }
  EXPECT_FALSE(c.b.has_unfinished());
}

// The deadline is max(floor, margin x predicted); a step the model cannot
// predict gets max(floor, cold). What the worker reports is observed.
TEST(BatcherDeadlines, TheDeadlineFollowsTheCostModel) {
  for (int64_t predicted_ms : {0, 10}) {
    Cluster c(deadlines(/*floor_ms=*/5, /*cold_ms=*/200, /*margin=*/8));
    auto cost = std::make_shared<FixedCost>();
    cost->ns = predicted_ms * kMs;
    c.add(1, worker_options(), cost);
    ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(5), 4), c.now));
    c.frozen.insert(1);
    c.round();
    const int64_t allowed_ms = predicted_ms == 0 ? 200 : 80;
    c.now += (allowed_ms - 1) * kMs;
    EXPECT_TRUE(c.b.take_hung(c.now).empty()) << predicted_ms;
    c.now += 2 * kMs;
    const auto hung = c.b.take_hung(c.now);
    ASSERT_EQ(hung.size(), 1u) << predicted_ms;
    EXPECT_EQ(hung[0].deadline_ns, allowed_ms * kMs);
  }
  Cluster c(deadlines(5));
  auto cost = std::make_shared<FixedCost>();
  cost->ns = kMs;
  c.add(1, worker_options(), cost);
  ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(5), 3), c.now));
  c.run();
  ASSERT_GE(cost->observed.size(), 3u);
  EXPECT_EQ(cost->observed[0].first, 1u);  // step ids, in order
  EXPECT_EQ(cost->observed[1].first, 2u);
}

TEST(BatcherDeadlines, FloorZeroMeansNoDeadlines) {
  Cluster c(deadlines(0));
  c.add(1);
  ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(5), 4), c.now));
  c.frozen.insert(1);
  c.round();
  c.now += int64_t{3600} * 1000 * kMs;
  EXPECT_TRUE(c.b.take_hung(c.now).empty());
  EXPECT_TRUE(c.b.has_worker(1));
}

TEST(BatcherDeadlines, ImpossibleOptionsAreRefused) {
  BatcherOptions o;
  o.step_timeout_margin = 0.5;
  EXPECT_THROW(Batcher b(o), std::invalid_argument);
  o = BatcherOptions{};
  o.step_timeout_floor_ns = -1;
  EXPECT_THROW(Batcher b(o), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::core
