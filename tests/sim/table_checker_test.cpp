// The workers' tables on a thread: plans the tables accept pass, a plan one
// refuses is reported, and the thread's own sampled tokens follow the
// simulator's (a later plan that feeds them passes).
#include "cluster/sim/table_checker.hpp"

#include <gtest/gtest.h>

namespace troupe::cluster::sim {
namespace {

core::SequenceTableOptions options() {
  core::SequenceTableOptions o;
  o.num_blocks = 16;
  o.block_size = 4;
  o.max_positions = 64;
  o.vocab_size = 50;
  return o;
}

// A plan that introduces sequence `id` with a 5-token prompt in blocks 0-1.
core::StepPlan prefill(uint64_t step, uint64_t id) {
  core::StepPlan p;
  p.step_id = step;
  core::NewSequence ns;
  ns.seq_id = id;
  ns.tokens = {1, 2, 3, 4, 5};
  ns.sampling.seed = 1;
  p.new_seqs.push_back(ns);
  core::SeqWork w;
  w.seq_id = id;
  w.start_pos = 0;
  w.num_tokens = 5;
  w.new_blocks = {0, 1};
  w.sample = true;
  p.work.push_back(w);
  return p;
}

core::StepPlan decode(uint64_t step, uint64_t id, int32_t pos) {
  core::StepPlan p;
  p.step_id = step;
  core::SeqWork w;
  w.seq_id = id;
  w.start_pos = pos;
  w.num_tokens = 1;
  w.sample = true;
  if (pos % 4 == 0) w.new_blocks = {pos / 4};  // blocks of 4 slots: 0 and 1 came with the prompt
  p.work.push_back(w);
  return p;
}

TEST(TableChecker, AcceptsPlansATableAccepts) {
  TableChecker c({options(), options()});
  c.submit(0, prefill(1, 7));
  c.submit(1, prefill(1, 8));
  // Position 5 is the token the thread "sampled" itself: known to the table.
  for (int32_t pos = 5; pos < 20; ++pos) c.submit(0, decode(static_cast<uint64_t>(pos - 3), 7, pos));
  EXPECT_TRUE(c.finish());
  EXPECT_TRUE(c.finish());  // asking again changes nothing
}

TEST(TableChecker, ReportsARefusal) {
  TableChecker c({options()});
  c.submit(0, prefill(1, 7));
  c.submit(0, decode(2, 9, 0));                                 // a sequence the worker never learned
  for (int i = 0; i < 3000; ++i) c.submit(0, decode(3, 9, 0));  // more than the ring holds: no deadlock
  EXPECT_FALSE(c.finish());
}

TEST(TableChecker, ReportsPositionsThatDisagree) {
  TableChecker c({options()});
  c.submit(0, prefill(1, 7));
  c.submit(0, decode(2, 7, 6));  // the worker has computed 5 tokens, not 6
  EXPECT_FALSE(c.finish());
}

TEST(TableChecker, StopsWhenDroppedUnfinished) {
  auto c = std::make_unique<TableChecker>(std::vector<core::SequenceTableOptions>{options()});
  for (int i = 0; i < 100; ++i) c->submit(0, prefill(1, 7));
  c.reset();  // joins: the test fails by hanging or crashing
}

}  // namespace
}  // namespace troupe::cluster::sim
