// The scheduler under KV pressure: preemption by recompute, prefix caching,
// LRU eviction, the admission watermark and a lost worker.
#include <gtest/gtest.h>

#include <algorithm>

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

// Pool of 6 blocks of 4: two sequences of 8 + 12 tokens cannot both fit.
TEST(Scheduler, DecodeOutOfBlocksPreemptsTheNewestWhichResumesUnchanged) {
  SchedulerOptions o = small_options();
  o.num_blocks = 6;
  o.enable_prefix_caching = false;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(8), 12)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(8, 40), 12)));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 0, 8, true}, {2, 0, 8, true}}));
  ASSERT_FALSE(h.submit(make_request(3, {7}, 1)));  // finds no free block until 2 is preempted
  bool saw = false;
  for (int i = 0; i < 40 && h.sched.has_unfinished(); ++i) {
    const int64_t before = h.sched.stats().preemptions;
    auto p = h.step();
    if (!saw && h.sched.stats().preemptions > before) {
      saw = true;
      // Sequence 1 (oldest) crossed into its 4th block: 2 was preempted, 3 not admitted.
      EXPECT_EQ(view(p), (std::vector<ChunkView>{{1, 12, 1, true}}));
      EXPECT_TRUE(h.sched.is_waiting(2));
      EXPECT_TRUE(h.sched.is_waiting(3));
    }
  }
  EXPECT_TRUE(saw);
  EXPECT_FALSE(h.sched.has_unfinished());
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 8, 12));
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 8, 12));  // nothing lost or repeated
  EXPECT_EQ(h.final_event(2)->usage.completion_tokens, 12);
  EXPECT_GE(h.sched.stats().preemptions, 1);
  EXPECT_EQ(h.sched.stats().blocks_used, 0);
}

// The worker learns which of a sequence's tokens were generated (what the
// presence and frequency penalties count): none at first admission, all it
// had made when it comes back after a preemption, its output_ids when a
// request is resumed.
TEST(Scheduler, ANewSequenceSaysHowManyOfItsTokensWereGenerated) {
  SchedulerOptions o = small_options();
  o.num_blocks = 6;
  o.enable_prefix_caching = false;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(8), 12)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(8, 40), 12)));
  std::vector<std::pair<size_t, int32_t>> admissions_of_2;  // (tokens sent, num_generated)
  for (int i = 0; i < 60 && h.sched.has_unfinished(); ++i) {
    const StepPlan p = h.step();
    for (const NewSequence& ns : p.new_seqs)
      if (ns.seq_id == 2) admissions_of_2.emplace_back(ns.tokens.size(), ns.num_generated);
  }
  ASSERT_GE(admissions_of_2.size(), 2u) << "2 was meant to be preempted and come back";
  EXPECT_EQ(admissions_of_2[0], (std::pair<size_t, int32_t>{8, 0}));
  for (size_t k = 1; k < admissions_of_2.size(); ++k) {
    EXPECT_GT(admissions_of_2[k].first, 8u);
    EXPECT_EQ(admissions_of_2[k].second, static_cast<int32_t>(admissions_of_2[k].first) - 8);
  }
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 8, 12));

  Harness r(small_options());
  Request resumed = make_request(3, {1, 2, 3, 4}, 6);
  resumed.output_ids = {50, 51, 52};
  ASSERT_FALSE(r.submit(resumed));
  const StepPlan first = r.step();
  ASSERT_EQ(first.new_seqs.size(), 1u);
  EXPECT_EQ(first.new_seqs[0].tokens, (std::vector<int32_t>{1, 2, 3, 4, 50, 51, 52}));
  EXPECT_EQ(first.new_seqs[0].num_generated, 3);
}

TEST(Scheduler, SequenceNeedingABlockPreemptsItselfWhenItIsTheNewest) {
  SchedulerOptions o = small_options();
  o.num_blocks = 4;
  o.enable_prefix_caching = false;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(6), 6)));      // 6 + 5 slots: 3 blocks
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(4, 40), 6)));  // 4 + 5 slots: 3 blocks
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 0, 6, true}, {2, 0, 4, true}}));
  // 2 (newest) needs a second block at once and takes the last free one; 1 fits.
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 6, 1, true}, {2, 4, 1, true}}));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 7, 1, true}, {2, 5, 1, true}}));
  // 1 crosses into block 3: no block left, so the newest (2) goes.
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 8, 1, true}}));
  EXPECT_EQ(h.sched.stats().preemptions, 1);
  h.run_until_idle();
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 4, 6));

  // Now the newest one itself runs out: 1 holds 3 blocks while 2 (newer) grows.
  Harness g(o);
  ASSERT_FALSE(g.submit(make_request(1, range_tokens(4), 5)));      // 4 + 4 slots: 2 blocks
  ASSERT_FALSE(g.submit(make_request(2, range_tokens(7, 40), 5)));  // 7 + 4 slots: 3 blocks
  EXPECT_EQ(view(g.step()), (std::vector<ChunkView>{{1, 0, 4, true}, {2, 0, 7, true}}));  // 1 + 2 blocks
  EXPECT_EQ(view(g.step()), (std::vector<ChunkView>{{1, 4, 1, true}, {2, 7, 1, true}}));  // 1 takes the last
  // 2 at position 8 needs a 3rd block; it is the newest, so it preempts itself.
  EXPECT_EQ(view(g.step()), (std::vector<ChunkView>{{1, 5, 1, true}}));
  EXPECT_TRUE(g.sched.is_waiting(2));
  g.run_until_idle();
  EXPECT_EQ(outputs(g, 1), scripted(g, 1, 4, 5));
  EXPECT_EQ(outputs(g, 2), scripted(g, 2, 7, 5));
}

TEST(Scheduler, PreemptionStormLosesNothing) {
  SchedulerOptions o = small_options();
  o.num_blocks = 12;
  o.block_size = 2;
  o.max_num_batched_tokens = 32;
  o.max_num_seqs = 8;
  Harness h(o);
  for (uint64_t id = 1; id <= 8; ++id) {
    ASSERT_FALSE(h.submit(make_request(id, range_tokens(3, static_cast<int32_t>(id) * 10), 15)));
  }
  h.run_until_idle();
  for (uint64_t id = 1; id <= 8; ++id) {
    ASSERT_NE(h.final_event(id), nullptr) << id;
    EXPECT_EQ(h.finals[id], 1);
    EXPECT_EQ(outputs(h, id), scripted(h, id, 3, 15)) << id;
  }
  EXPECT_GE(h.sched.stats().preemptions, 5);
  EXPECT_GE(h.steps_with_preemption, 3);
  EXPECT_EQ(h.sched.stats().blocks_used, 0);
}

TEST(Scheduler, SecondRequestReusesCachedPrefixBlocks) {
  Harness h(small_options());
  auto prefix = range_tokens(12, 500);
  auto pa = prefix;
  pa.insert(pa.end(), {1, 2});
  ASSERT_FALSE(h.submit(make_request(1, pa, 2)));
  h.step();
  const auto a_blocks = h.last.chunks.at(0).block_table;
  h.run_until_idle();
  EXPECT_EQ(h.sched.stats().blocks_cached, 3);

  auto pb = prefix;
  pb.insert(pb.end(), {7, 7, 7});
  auto pc = prefix;
  pc.insert(pc.end(), {8});
  ASSERT_FALSE(h.submit(make_request(2, pb, 3)));
  ASSERT_FALSE(h.submit(make_request(3, pc, 3)));
  auto p = h.step();
  EXPECT_EQ(view(p), (std::vector<ChunkView>{{2, 12, 3, true}, {3, 12, 1, true}}));
  for (const auto& c : h.last.chunks) {
    EXPECT_EQ(std::vector<int32_t>(c.block_table.begin(), c.block_table.begin() + 3),
              std::vector<int32_t>(a_blocks.begin(), a_blocks.begin() + 3));
  }
  EXPECT_EQ(h.sched.allocator().ref_count(a_blocks[0]), 2);  // shared by 2 and 3
  auto st = h.sched.stats();
  EXPECT_EQ(st.prefix_hit_blocks, 6);
  EXPECT_EQ(st.prefix_hit_tokens, 24);
  h.run_until_idle();
  EXPECT_EQ(h.final_event(2)->usage.cached_tokens, 12);
  EXPECT_EQ(h.final_event(3)->usage.cached_tokens, 12);
  EXPECT_EQ(h.final_event(1)->usage.cached_tokens, 0);
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 15, 3));

  // A prompt that is exactly the cached blocks still computes its last block.
  ASSERT_FALSE(h.submit(make_request(4, prefix, 1)));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{4, 8, 4, true}}));
  EXPECT_EQ(h.final_event(4)->usage.cached_tokens, 8);
}

TEST(Scheduler, GeneratedTokensFillCacheableBlocksToo) {
  Harness h(small_options());
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(2, 300), 8)));
  h.run_until_idle();
  // 2 prompt + 7 fed-back tokens = 9 computed: two full blocks.
  EXPECT_EQ(h.sched.stats().blocks_cached, 2);
  auto again = range_tokens(2, 300);
  auto out = outputs(h, 1);
  again.insert(again.end(), out.begin(), out.end());  // prompt = the whole first conversation
  ASSERT_FALSE(h.submit(make_request(2, again, 1)));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{2, 8, 2, true}}));
}

TEST(Scheduler, CachedBlocksAreEvictedLeastRecentlyReleasedFirst) {
  SchedulerOptions o = small_options();
  o.num_blocks = 8;
  o.block_size = 2;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, {1, 2, 3, 4}, 1)));
  h.run_until_idle();
  ASSERT_FALSE(h.submit(make_request(2, {5, 6, 7, 8}, 1)));
  h.run_until_idle();
  EXPECT_EQ(h.sched.stats().blocks_cached, 4);
  // 13 tokens need 7 blocks: the 4 clean ones, then 1's two and 2's tail block.
  ASSERT_FALSE(h.submit(make_request(3, range_tokens(13, 100), 1)));
  h.run_until_idle();
  EXPECT_EQ(h.sched.stats().evictions, 3);
  ASSERT_FALSE(h.submit(make_request(5, {5, 6, 7, 8}, 1)));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{5, 2, 2, true}}));  // 2's first block survived
  ASSERT_FALSE(h.submit(make_request(4, {1, 2, 3, 4}, 1)));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{4, 0, 4, true}}));  // 1's blocks are gone
  EXPECT_EQ(h.sched.stats().prefix_hit_blocks, 1);
}

TEST(Scheduler, WatermarkHoldsBackAdmission) {
  SchedulerOptions o = small_options();
  o.num_blocks = 10;
  o.watermark = 0.2;  // 2 blocks kept free for running sequences
  o.max_num_batched_tokens = 64;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(24), 2)));  // 6 blocks
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(12, 50), 2)));
  auto p = h.step();
  // 1 takes 6 blocks; 2 gets only 2 blocks' worth (4 free - 2 kept) of its prompt.
  EXPECT_EQ(view(p), (std::vector<ChunkView>{{1, 0, 24, true}, {2, 0, 8, false}}));
  h.run_until_idle();
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 12, 2));
}

TEST(Scheduler, LostWorkerRequeuesEverythingForRecompute) {
  SchedulerOptions o = small_options();
  o.max_num_batched_tokens = 8;
  Harness h(o);
  for (uint64_t id = 1; id <= 3; ++id)
    ASSERT_FALSE(h.submit(make_request(id, range_tokens(6, 10 * static_cast<int32_t>(id)), 6)));
  h.step();
  h.step();
  h.plan_and_run();  // lost with this step in flight
  h.results.clear();
  h.sched.on_worker_lost();
  h.sched.check_invariants();
  EXPECT_FALSE(h.sched.step_in_flight());
  EXPECT_EQ(h.sched.num_running(), 0);
  EXPECT_EQ(h.sched.num_waiting(), 3);
  EXPECT_EQ(h.sched.stats().blocks_used, 0);
  EXPECT_EQ(h.sched.stats().blocks_cached, 0);
  std::fill(h.kv.begin(), h.kv.end(), 0);  // a new worker: empty pool, no sequences
  h.worker = SequenceTable(test::table_options(o));
  h.run_until_idle();
  for (uint64_t id = 1; id <= 3; ++id) EXPECT_EQ(outputs(h, id), scripted(h, id, 6, 6));
}

}  // namespace
}  // namespace troupe::core
