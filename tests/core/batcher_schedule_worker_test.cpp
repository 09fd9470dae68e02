// Batcher::schedule(now, worker): plans only the named worker (and workers
// that take a waiting request now), and the same plans schedule(now) makes.
#include <gtest/gtest.h>

#include "core/batcher.hpp"
#include "scheduler_harness.hpp"

namespace troupe::core {
namespace {

using test::make_request;
using test::range_tokens;

SchedulerOptions options() {
  SchedulerOptions o = test::small_options();
  o.max_steps_in_flight = 2;
  return o;
}

std::vector<std::pair<uint64_t, uint64_t>> ids(const std::vector<Dispatch>& d) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& x : d) out.emplace_back(x.worker, x.plan.step_id);
  return out;
}

TEST(BatcherScheduleWorker, PlansOnlyThatWorkerAndTheSameAsScheduleAll) {
  BatcherOptions bo;
  bo.placement = PlacementPolicy::kRoundRobin;
  Batcher one(bo), all(bo);
  for (uint64_t w : {1, 2, 3}) {
    ASSERT_FALSE(one.add_worker({w, "n", "fake", options()}));
    ASSERT_FALSE(all.add_worker({w, "n", "fake", options()}));
  }
  for (uint64_t id = 1; id <= 3; ++id) {  // round-robin: request k on worker k
    ASSERT_FALSE(one.submit(make_request(id, range_tokens(6, 10 * id), 4), 0));
    ASSERT_FALSE(all.submit(make_request(id, range_tokens(6, 10 * id), 4), 0));
  }
  const auto two = one.schedule(0, 2);
  ASSERT_EQ(ids(two),
            (std::vector<std::pair<uint64_t, uint64_t>>{{2, 1}, {2, 2}}));  // prefill + planned decode
  for (uint64_t w : {1, 3}) EXPECT_EQ(one.scheduler(w)->steps_in_flight(), 0) << w;
  std::vector<Dispatch> rest = one.schedule(0, 1);
  for (auto& d : one.schedule(0, 3)) rest.push_back(std::move(d));
  for (auto& d : two) rest.push_back(d);
  const auto every = all.schedule(0);
  ASSERT_EQ(rest.size(), every.size());
  for (const auto& d : every) {
    auto it = std::find_if(rest.begin(), rest.end(), [&](const Dispatch& x) {
      return x.worker == d.worker && x.plan.step_id == d.plan.step_id;
    });
    ASSERT_NE(it, rest.end());
    EXPECT_EQ(test::view(it->plan), test::view(d.plan));
  }
  EXPECT_TRUE(one.schedule(0, 2).empty());   // two steps in flight
  EXPECT_TRUE(one.schedule(0, 99).empty());  // unknown worker: nothing
}

TEST(BatcherScheduleWorker, IntoABufferClearsItAndPlansTheSame) {
  BatcherOptions bo;
  bo.placement = PlacementPolicy::kRoundRobin;
  Batcher a(bo), b(bo);
  for (uint64_t w : {1, 2}) {
    ASSERT_FALSE(a.add_worker({w, "n", "fake", options()}));
    ASSERT_FALSE(b.add_worker({w, "n", "fake", options()}));
  }
  for (uint64_t id = 1; id <= 2; ++id) {
    ASSERT_FALSE(a.submit(make_request(id, range_tokens(6, 10 * id), 4), 0));
    ASSERT_FALSE(b.submit(make_request(id, range_tokens(6, 10 * id), 4), 0));
  }
  std::vector<Dispatch> buf = a.schedule(0, 1);  // holds worker 1's plans
  ASSERT_FALSE(buf.empty());
  (void)b.schedule(0, 1);
  a.schedule(0, 2, buf);
  const auto want = b.schedule(0, 2);
  ASSERT_EQ(ids(buf), ids(want));  // worker 1's plans are gone
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(test::view(buf[i].plan), test::view(want[i].plan));
  a.schedule(0, 2, buf);  // two steps in flight: nothing, and nothing left over
  EXPECT_TRUE(buf.empty());
}

TEST(BatcherScheduleWorker, AlsoPlansWorkersTakingWaitingRequests) {
  Batcher b;
  ASSERT_FALSE(b.submit(make_request(7, range_tokens(5), 3), 0));  // no worker yet: it waits
  EXPECT_EQ(b.num_unplaced(), 1);
  ASSERT_FALSE(b.add_worker({4, "n", "fake", options()}));
  const auto d = b.schedule(1, 0);  // no worker named: the one that took request 7 is planned
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].worker, 4u);
  EXPECT_EQ(b.num_unplaced(), 0);
}

}  // namespace
}  // namespace troupe::core
