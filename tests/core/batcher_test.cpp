// The cluster batcher over scripted workers (core::SequenceTable each, no
// model): placement policies, two steps in flight per worker, a lost worker's
// requests moving with nothing repeated or lost, drain, requests waiting for a
// worker, and a worker that sends nonsense.
#include "core/batcher.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>

#include "batcher_harness.hpp"

namespace troupe::core {
namespace {

using test::Cluster;
using test::make_request;
using test::range_tokens;
using test::worker_options;

TEST(Batcher, RoundRobinAlternatesAndEveryRequestFinishes) {
  BatcherOptions o;
  o.placement = PlacementPolicy::kRoundRobin;
  Cluster c(o);
  c.add(1);
  c.add(2);
  for (uint64_t id = 10; id < 16; ++id)
    ASSERT_FALSE(c.b.submit(make_request(id, range_tokens(5, 100 * id), 6), c.now));
  for (uint64_t id = 10; id < 16; ++id) EXPECT_EQ(c.b.worker_of(id), id % 2 == 0 ? 1u : 2u) << id;
  c.run();
  for (uint64_t id = 10; id < 16; ++id) {
    ASSERT_EQ(c.finals[id].size(), 1u);
    EXPECT_EQ(c.finals[id][0].output_ids, c.expected(id, 5, 6));
    EXPECT_EQ(c.tokens[id], c.expected(id, 5, 6));
  }
  EXPECT_GT(c.plans[1], 0);
  EXPECT_GT(c.plans[2], 0);
}

TEST(Batcher, LeastLoadedFillsTheEmptierWorker) {
  BatcherOptions o;
  o.placement = PlacementPolicy::kLeastLoaded;
  Cluster c(o);
  c.add(1);
  c.add(2);
  ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(4), 30), c.now));
  ASSERT_FALSE(c.b.submit(make_request(2, range_tokens(4, 9), 30), c.now));
  ASSERT_FALSE(c.b.submit(make_request(3, range_tokens(4, 19), 30), c.now));
  EXPECT_NE(c.b.worker_of(1), c.b.worker_of(2));
  c.round();
  c.b.cancel(c.b.worker_of(1) == c.b.worker_of(3) ? 2 : 1);  // one worker now has 2, the other 0
  const uint64_t empty =
      c.b.worker_of(1) != 0 ? (c.b.worker_of(1) == 1 ? 2 : 1) : (c.b.worker_of(2) == 1 ? 2 : 1);
  ASSERT_FALSE(c.b.submit(make_request(4, range_tokens(4, 29), 3), c.now));
  EXPECT_EQ(c.b.worker_of(4), empty);
}

TEST(Batcher, PrefixAffinityGoesWhereThePrefixIsCached) {
  Cluster c;  // prefix affinity is the default
  c.add(1);
  c.add(2);
  const auto shared = range_tokens(16, 500);
  auto with = [&](std::vector<int32_t> tail) {
    auto p = shared;
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  ASSERT_FALSE(c.b.submit(make_request(1, with({1}), 2), c.now));
  const uint64_t home = c.b.worker_of(1);
  c.run();
  // The other worker is emptier in blocks, but the prefix lives on `home`.
  for (uint64_t id = 2; id < 5; ++id) {
    ASSERT_FALSE(c.b.submit(make_request(id, with({static_cast<int32_t>(id), 7}), 2), c.now));
    EXPECT_EQ(c.b.worker_of(id), home) << id;
  }
  c.run();
  EXPECT_EQ(c.finals[4][0].usage.cached_tokens, 16);
  // Without a cached prefix it goes to the less loaded worker.
  ASSERT_FALSE(c.b.submit(make_request(8, with({8}), 20), c.now));
  EXPECT_EQ(c.b.worker_of(8), home);
  ASSERT_FALSE(c.b.submit(make_request(9, range_tokens(6, 9000), 2), c.now));
  EXPECT_NE(c.b.worker_of(9), home);
  c.run();
}

// Submits 160 requests of five prompt families (and none) to `c`'s workers
// 1..4, checking each placement against asking every worker.
void expect_prefix_affinity_asks_every_worker(Cluster& c) {
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> families;
  for (int f = 0; f < 5; ++f) families.push_back(range_tokens(12, 1000 * (f + 1)));
  int hits = 0, checked = 0;
  for (uint64_t id = 1; id <= 160; ++id) {
    std::vector<int32_t> prompt;
    const int f = static_cast<int>(rng() % 6);  // 5: no shared prefix
    if (f < 5) prompt.assign(families[f].begin(), families[f].begin() + 4 * (1 + rng() % 3));
    for (int k = 0, n = 1 + static_cast<int>(rng() % 6); k < n; ++k)
      prompt.push_back(static_cast<int32_t>(20000 + id * 10 + k));
    // Every worker asked, as placement did before the index.
    uint64_t want = 0;
    int32_t want_hit = -1, want_load = 0, want_free = 0;
    for (uint64_t w = 1; w <= 4; ++w) {
      const Scheduler* s = c.b.scheduler(w);
      if (s == nullptr) continue;
      const int32_t hit = s->cached_prefix_blocks(prompt);
      const int32_t load = s->num_running() + s->num_waiting(), free = s->allocator().num_free();
      if (want == 0 || hit > want_hit ||
          (hit == want_hit && (load < want_load || (load == want_load && free > want_free)))) {
        want = w;
        want_hit = hit;
        want_load = load;
        want_free = free;
      }
    }
    ASSERT_FALSE(c.b.submit(make_request(id, prompt, 1 + static_cast<int32_t>(rng() % 4)), c.now));
    EXPECT_EQ(c.b.worker_of(id), want) << "request " << id << " (hit " << want_hit << ")";
    hits += want_hit > 0;
    ++checked;
    if (id % 3 == 0) c.round();
    if (id == 80) c.lose(2);  // its cache leaves the index with it
  }
  c.run();
  EXPECT_EQ(checked, 160);
  EXPECT_GT(hits, 40) << "the workload must exercise cache hits";
}

// Prefix affinity asks only the workers the cluster's index of first blocks
// names; the choice must be the one asking every worker gives: the most
// cached blocks, then the least loaded, then the most free blocks, then the
// lowest id. Checked request by request on a busy cluster whose small pools
// evict, with shared prefixes of several lengths, and a worker that leaves.
TEST(Batcher, PrefixAffinityPicksAsIfItAskedEveryWorker) {
  Cluster c;
  for (uint64_t id = 1; id <= 4; ++id) c.add(id, worker_options(/*blocks=*/24));
  expect_prefix_affinity_asks_every_worker(c);
}

// The same with workers of two block sizes: the index is asked per block size.
TEST(Batcher, PrefixAffinityPicksAsIfItAskedEveryWorkerOfTwoBlockSizes) {
  Cluster c;
  for (uint64_t id = 1; id <= 4; ++id) {
    SchedulerOptions o = worker_options(/*blocks=*/24);
    if (id % 2 == 0) {
      o.block_size = 8;
      o.num_blocks = 12;
    }
    c.add(id, o);
  }
  expect_prefix_affinity_asks_every_worker(c);
}

// Placement reads a board of every worker's load and free blocks, kept by the
// batcher as it calls the schedulers: it must pick exactly as asking every
// worker's scheduler would, through submissions, steps, finishes, a drain and
// a loss, over workers of different limits.
TEST(Batcher, LeastLoadedPicksAsIfItAskedEveryWorker) {
  BatcherOptions bo;
  bo.placement = PlacementPolicy::kLeastLoaded;
  Cluster c(bo);
  SchedulerOptions short_ctx = worker_options(/*blocks=*/40), roomy = worker_options(/*blocks=*/28);
  short_ctx.max_model_len = 24;
  for (uint64_t id = 1; id <= 6; ++id) c.add(id, id % 2 ? short_ctx : roomy);
  std::mt19937 rng(11);
  int checked = 0, too_long_for_some = 0;
  for (uint64_t id = 1; id <= 240; ++id) {
    const int32_t prompt = 2 + static_cast<int32_t>(rng() % 20), out = 1 + static_cast<int32_t>(rng() % 8);
    const Request r = make_request(id, range_tokens(prompt, 100 * static_cast<int32_t>(id)), out);
    uint64_t want = 0;
    int32_t want_load = 0, want_free = 0;
    for (uint64_t w = 1; w <= 6; ++w) {
      const Scheduler* s = c.b.scheduler(w);
      if (s == nullptr || !s->fits(r) || (w == 3 && id > 120)) continue;  // 3 drains from request 121
      const int32_t load = s->num_running() + s->num_waiting(), free = s->allocator().num_free();
      if (want == 0 || load < want_load || (load == want_load && free > want_free)) {
        want = w;
        want_load = load;
        want_free = free;
      }
    }
    ASSERT_FALSE(c.b.submit(r, c.now));
    EXPECT_EQ(c.b.worker_of(id), want) << "request " << id;
    EXPECT_NO_THROW(c.b.check_invariants());
    ++checked;
    too_long_for_some += prompt + out > 24;
    if (id % 4 == 0) c.round();
    if (id % 37 == 0) c.b.cancel(id - 5);
    if (id == 120) {
      ASSERT_TRUE(c.b.drain_worker(3));
    }
    if (id == 180) c.lose(4);
  }
  c.run();
  EXPECT_EQ(checked, 240);
  EXPECT_GT(too_long_for_some, 15) << "the workload must exercise the limits";
}

TEST(Batcher, ALostWorkersRequestsContinueElsewhereWithNothingRepeatedOrLost) {
  BatcherOptions o;
  o.placement = PlacementPolicy::kRoundRobin;
  Cluster c(o);
  c.add(1);
  c.add(2);
  for (uint64_t id = 1; id <= 6; ++id)
    ASSERT_FALSE(c.b.submit(make_request(id, range_tokens(7, 10 * id), 20), c.now));
  for (int i = 0; i < 8; ++i) c.round();
  std::vector<uint64_t> moved;
  for (uint64_t id = 1; id <= 6; ++id)
    if (c.b.worker_of(id) == 2) moved.push_back(id);
  ASSERT_FALSE(moved.empty());
  c.lose(2);  // kill -9: its steps in flight are gone
  for (uint64_t id : moved) EXPECT_EQ(c.b.worker_of(id), 1u) << id;
  c.run();
  for (uint64_t id = 1; id <= 6; ++id) {
    ASSERT_EQ(c.finals[id].size(), 1u) << id;
    EXPECT_EQ(c.finals[id][0].finish_reason, FinishReason::kLength);
    EXPECT_EQ(c.tokens[id], c.expected(id, 7, 20))
        << "request " << id << ": streamed tokens without gaps or repeats";
    EXPECT_EQ(c.finals[id][0].output_ids, c.expected(id, 7, 20)) << id;
  }
}

TEST(Batcher, AScoringRequestMovedMidPromptIsScoredOnceAndCompletely) {
  BatcherOptions o;
  o.placement = PlacementPolicy::kRoundRobin;
  Cluster c(o);
  SchedulerOptions w = worker_options();
  w.max_num_batched_tokens = 8;  // a 60-token prompt takes 8 steps
  c.add(1, w);
  c.add(2, w);
  const auto prompt = range_tokens(60, 300);
  Request r = make_request(1, prompt, 4);
  r.sampling.prompt_logprobs = 1;
  ASSERT_FALSE(c.b.submit(r, c.now));
  const uint64_t first = c.b.worker_of(1);
  for (int i = 0; i < 3; ++i) c.round();
  ASSERT_FALSE(c.prompt_scored[1].empty()) << "some positions came before the move";
  ASSERT_LT(c.prompt_scored[1].size(), 59u) << "the move must come mid-prompt";
  c.lose(first);
  EXPECT_NE(c.b.worker_of(1), first);
  c.run();
  EXPECT_EQ(c.prompt_scored[1], std::vector<int32_t>(prompt.begin() + 1, prompt.end()))
      << "every position once, in order, across the move";
  ASSERT_EQ(c.finals[1].size(), 1u);
  EXPECT_EQ(c.tokens[1], c.expected(1, 60, 4));
}

TEST(Batcher, RequestsWaitForAWorkerAndFailAtTheirDeadline) {
  BatcherOptions o;
  o.unplaced_timeout_ns = 5000;
  Cluster c(o);
  ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(5), 3), c.now));
  EXPECT_EQ(c.b.num_unplaced(), 1);
  EXPECT_EQ(c.b.next_deadline(), std::optional<int64_t>(5000));
  c.round();
  c.add(1);  // joins in time
  c.run();
  ASSERT_EQ(c.finals[1].size(), 1u);
  EXPECT_EQ(c.finals[1][0].output_ids, c.expected(1, 5, 3));

  c.lose(1);
  ASSERT_FALSE(c.b.submit(make_request(2, range_tokens(5), 3), c.now));
  for (int i = 0; i < 6; ++i) c.round();
  ASSERT_EQ(c.finals[2].size(), 1u);
  EXPECT_EQ(c.finals[2][0].finish_reason, FinishReason::kError);
  EXPECT_NE(c.finals[2][0].error.find("deadline"), std::string::npos) << c.finals[2][0].error;
  EXPECT_FALSE(c.b.has_unfinished());
}

TEST(Batcher, RefusesWhatNoWorkerCanRunAndDuplicateIds) {
  Cluster c;
  c.add(1, worker_options(/*blocks=*/4));  // 16 slots
  auto err = c.b.submit(make_request(1, range_tokens(20), 2), c.now);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("KV blocks"), std::string::npos) << *err;
  ASSERT_FALSE(c.b.submit(make_request(2, range_tokens(4), 2), c.now));
  err = c.b.submit(make_request(2, range_tokens(4), 2), c.now);
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("in use"), std::string::npos) << *err;
  // A bigger worker joins: now it fits, and goes there.
  c.add(2, worker_options(64));
  ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(20), 2), c.now));
  EXPECT_EQ(c.b.worker_of(1), 2u);
  // A worker with another model is refused.
  SchedulerOptions other = worker_options();
  other.vocab_size = 1000;
  other.eos_id = 999;
  err = c.b.add_worker({3, "n3", "fake", other});
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("another model"), std::string::npos) << *err;
  c.run();
}

// Placement asks each worker whether a request fits its own limits
// (max_model_len, KV pool, one-step prompts without chunked prefill): under
// every policy a request goes only to a worker it fits, however loaded.
TEST(Batcher, PlacementSkipsWorkersWhoseLimitsARequestExceeds) {
  for (PlacementPolicy policy :
       {PlacementPolicy::kRoundRobin, PlacementPolicy::kLeastLoaded, PlacementPolicy::kPrefixAffinity}) {
    BatcherOptions bo;
    bo.placement = policy;
    Cluster c(bo);
    SchedulerOptions short_ctx = worker_options(), few_blocks = worker_options(/*blocks=*/6),
                     no_chunking = worker_options(), roomy = worker_options();
    short_ctx.max_model_len = 32;
    no_chunking.enable_chunked_prefill = false;
    no_chunking.max_num_batched_tokens = 40;
    c.add(1, short_ctx);
    c.add(2, few_blocks);  // 24 slots
    c.add(3, no_chunking);
    c.add(4, roomy);
    const std::string who = to_string(policy);
    // 31 prompt + 11 output (41 slots): only the roomy worker, however loaded.
    for (uint64_t id = 100; id < 104; ++id) {
      ASSERT_FALSE(
          c.b.submit(make_request(id, range_tokens(31, 500 + 100 * static_cast<int32_t>(id)), 11), c.now));
      EXPECT_EQ(c.b.worker_of(id), 4u) << who;
    }
    // 30 + 10: past worker 1's context and worker 2's 24 slots; 39 slots in
    // one step at most for worker 3 (40 allowed), which is idle.
    ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(30, 1000), 10), c.now));
    EXPECT_EQ(c.b.worker_of(1), 3u) << who;
    // 10 + 5 fits everywhere: round-robin's next after 3; for the others the
    // idle worker with the most free blocks.
    ASSERT_FALSE(c.b.submit(make_request(2, range_tokens(10, 3000), 5), c.now));
    EXPECT_EQ(c.b.worker_of(2), policy == PlacementPolicy::kRoundRobin ? 4u : 1u) << who;
    c.run();
  }
}

TEST(Batcher, DrainMovesQueuedRequestsAndLetsRunningOnesFinish) {
  BatcherOptions o;
  o.placement = PlacementPolicy::kRoundRobin;
  Cluster c(o);
  SchedulerOptions one_at_a_time = worker_options();
  one_at_a_time.max_num_seqs = 1;
  c.add(1, one_at_a_time);
  c.add(2, one_at_a_time);
  for (uint64_t id = 1; id <= 4; ++id)
    ASSERT_FALSE(c.b.submit(make_request(id, range_tokens(4, 10 * id), 5), c.now));
  c.round();  // 1 runs on worker 1, 2 on worker 2; 3 and 4 wait
  ASSERT_EQ(c.b.worker_of(3), 1u);
  ASSERT_TRUE(c.b.drain_worker(1));
  EXPECT_EQ(c.b.worker_of(1), 1u) << "running: stays";
  EXPECT_EQ(c.b.worker_of(3), 2u) << "queued: moved";
  EXPECT_FALSE(c.b.drained(1));
  ASSERT_FALSE(c.b.submit(make_request(5, range_tokens(4, 50), 2), c.now));
  EXPECT_EQ(c.b.worker_of(5), 2u) << "a draining worker takes nothing new";
  c.run();
  EXPECT_TRUE(c.b.drained(1));
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(c.tokens[id], c.expected(id, 4, 5)) << id;
}

TEST(Batcher, AWorkerSendingNonsenseIsRemovedAndItsRequestsMove) {
  Cluster c;
  c.add(1);
  c.add(2);
  ASSERT_FALSE(c.b.submit(make_request(1, range_tokens(5), 4), c.now));
  const uint64_t w = c.b.worker_of(1);
  auto ds = c.b.schedule(c.now);
  ASSERT_FALSE(ds.empty());
  StepResult junk;
  junk.step_id = 12345;
  auto why = c.b.on_result(w, junk, c.now);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("does not fit"), std::string::npos) << *why;
  EXPECT_FALSE(c.b.has_worker(w));
  EXPECT_EQ(c.b.worker_of(1), w == 1 ? 2u : 1u);
  c.tables.erase(w);
  c.pending.clear();
  c.run();
  EXPECT_EQ(c.tokens[1], c.expected(1, 5, 4));
}

TEST(Batcher, ParsesPlacementNames) {
  for (auto p :
       {PlacementPolicy::kRoundRobin, PlacementPolicy::kLeastLoaded, PlacementPolicy::kPrefixAffinity})
    EXPECT_EQ(parse_placement(to_string(p)), p);
  EXPECT_THROW(parse_placement("random"), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::core
