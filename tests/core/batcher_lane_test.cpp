// Batcher lanes: on_result, schedule and admit for one worker that leave the
// shared state to merge(). Driven in another order of the workers, across two
// lanes, with requests placed by choose() and admitted in their lanes, they
// must do what the plain calls do: the same tokens, the same finishes, the
// same placement after each merge (the prefix-affinity index and the
// requests' homes follow).
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <stdexcept>
#include <vector>

#include "batcher_harness.hpp"
#include "core/batcher.hpp"
#include "core/sequence_table.hpp"

namespace troupe::core {
namespace {

using test::make_request;
using test::range_tokens;
using test::worker_options;

// Scripted workers behind one Batcher, driven worker by worker, with or
// without lanes (workers 1 and 3 in one, 2 and 4 in the other, taken in
// reverse order).
struct Driver {
  explicit Driver(bool lanes) : laned(lanes) {
    for (uint64_t id = 1; id <= 4; ++id) {
      EXPECT_FALSE(b.add_worker({id, "n", "fake", worker_options(12)}));  // small pools: evictions
      tables.emplace(id, SequenceTable(test::table_options(worker_options(12))));
    }
  }
  Batcher::Lane& lane_of(uint64_t id) { return lanes[(id - 1) % 2]; }
  std::vector<uint64_t> order() const {
    return laned ? std::vector<uint64_t>{4, 3, 2, 1} : std::vector<uint64_t>{1, 2, 3, 4};
  }
  void round() {
    for (uint64_t id : order()) {
      std::vector<Dispatch> plans;
      if (laned)
        b.schedule(now, id, plans, lane_of(id));
      else
        b.schedule(now, id, plans);
      for (const Dispatch& d : plans) {
        SequenceTable& t = tables.at(d.worker);
        PreparedStep p = t.prepare(d.plan);
        EXPECT_TRUE(p.failures.empty());
        StepResult r;
        r.step_id = d.plan.step_id;
        for (const auto& c : p.chunks)
          if (c.sample) r.outputs.push_back(test::scripted_output(c));
        t.commit(p, r.outputs, {});
        pending[d.worker].push_back(r);
      }
    }
    for (uint64_t id : order()) {
      auto& q = pending[id];
      if (q.empty()) continue;
      EXPECT_FALSE(laned ? b.on_result(id, q.front(), now, lane_of(id)) : b.on_result(id, q.front(), now));
      q.pop_front();
    }
    if (laned) {
      for (Batcher::Lane& l : lanes) {
        b.merge(l);
        take(l.events);
        l.events.clear();
      }
    } else {
      take(b.take_events());
    }
    now += 1000;
    EXPECT_NO_THROW(b.check_invariants());
  }
  void take(const std::vector<RequestEvent>& events) {
    for (const RequestEvent& ev : events) {
      if (ev.kind == EventKind::kToken) tokens[ev.request_id].push_back(ev.token_id);
      if (ev.finished()) finished[ev.request_id] = ev.usage.cached_tokens;
    }
  }

  bool laned;
  Batcher b;
  Batcher::Lane lanes[2];
  int64_t now = 0;
  std::map<uint64_t, SequenceTable> tables;
  std::map<uint64_t, std::deque<StepResult>> pending;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, int32_t> finished;  // request -> cached tokens
};

TEST(BatcherLane, LaneCallsDoWhatPlainCallsDo) {
  Driver plain(false), laned(true);
  uint64_t next = 1;
  for (int round = 0; round < 60; ++round) {
    // Two requests a round, most sharing one of three first blocks: prefix
    // affinity reads the index that the lanes' merges keep.
    for (int k = 0; k < 2; ++k, ++next) {
      std::vector<int32_t> prompt = range_tokens(16, 1000 * static_cast<int32_t>(next % 3 + 1));
      const std::vector<int32_t> own =
          range_tokens(5 + static_cast<int32_t>(next % 9), 20000 + 40 * static_cast<int32_t>(next));
      prompt.insert(prompt.end(), own.begin(), own.end());
      const int32_t max_tokens = 3 + static_cast<int32_t>(next % 11);
      ASSERT_FALSE(plain.b.submit(make_request(next, prompt, max_tokens), plain.now));
      // Laned: placed now, admitted in its worker's lane.
      uint64_t worker = 0;
      const Request r = make_request(next, prompt, max_tokens);
      ASSERT_FALSE(laned.b.choose(r, worker));
      laned.b.admit(worker, r, laned.lane_of(worker));
      EXPECT_EQ(laned.b.worker_of(next), plain.b.worker_of(next)) << "request " << next;
    }
    plain.round();
    laned.round();
    EXPECT_EQ(laned.b.num_unfinished(), plain.b.num_unfinished()) << "round " << round;
  }
  for (int i = 0; i < 200 && (plain.b.has_unfinished() || laned.b.has_unfinished()); ++i) {
    plain.round();
    laned.round();
  }
  EXPECT_FALSE(plain.b.has_unfinished());
  EXPECT_FALSE(laned.b.has_unfinished());
  EXPECT_EQ(laned.tokens, plain.tokens);
  EXPECT_EQ(laned.finished, plain.finished);
  ASSERT_EQ(plain.finished.size(), next - 1);
  int32_t cached = 0;
  int64_t evictions = 0;
  for (const auto& [id, c] : plain.finished) cached += c;
  for (uint64_t w = 1; w <= 4; ++w) evictions += plain.b.scheduler(w)->allocator().evictions();
  EXPECT_GT(cached, 0) << "the shared first blocks must hit";
  EXPECT_GT(evictions, 0) << "the pools must evict (the index loses blocks too)";
}

TEST(BatcherLane, LaneCallsNeedNoRequestWaitingAndAKnownWorker) {
  Batcher b;
  ASSERT_FALSE(b.submit(make_request(1, range_tokens(8), 2), 0));  // no worker yet: it waits
  ASSERT_EQ(b.num_unplaced(), 1);
  ASSERT_FALSE(b.add_worker({1, "n", "fake", worker_options()}));
  Batcher::Lane lane;
  std::vector<Dispatch> plans;
  EXPECT_THROW(b.schedule(0, 1, plans, lane), std::logic_error);
  b.schedule(0, 1, plans);  // places it
  ASSERT_EQ(b.num_unplaced(), 0);
  EXPECT_THROW(b.schedule(0, 7, plans, lane), std::logic_error);
  EXPECT_THROW(b.on_result(7, StepResult{}, 0, lane), std::logic_error);
  uint64_t worker = 0;
  EXPECT_TRUE(b.choose(make_request(1, range_tokens(8), 2), worker)) << "an id in use is refused";
  EXPECT_TRUE(b.choose(make_request(2, range_tokens(500), 2), worker)) << "too long for every worker";
  ASSERT_FALSE(b.choose(make_request(2, range_tokens(8), 2), worker));
  EXPECT_EQ(worker, 1u);
  EXPECT_EQ(b.worker_of(2), 1u);
  EXPECT_THROW(b.admit(7, make_request(3, range_tokens(8), 2), lane), std::logic_error);
}

TEST(BatcherLane, AResultThatDoesNotFitIsReturnedAndTheWorkerStays) {
  Batcher b;
  ASSERT_FALSE(b.add_worker({1, "n", "fake", worker_options()}));
  ASSERT_FALSE(b.submit(make_request(1, range_tokens(8), 2), 0));
  Batcher::Lane lane;
  std::vector<Dispatch> plans;
  b.schedule(0, 1, plans, lane);
  ASSERT_FALSE(plans.empty());
  StepResult wrong;
  wrong.step_id = plans.front().plan.step_id + 100;
  const auto err = b.on_result(1, wrong, 0, lane);
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("does not fit its plan"), std::string::npos) << *err;
  EXPECT_TRUE(b.has_worker(1));
  EXPECT_EQ(b.worker_of(1), 1u);
}

}  // namespace
}  // namespace troupe::core
