// SequenceTable: a worker's checking of step plans, without a model.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/sequence_table.hpp"

namespace troupe::core {
namespace {

SequenceTableOptions options() {
  SequenceTableOptions o;
  o.num_blocks = 8;
  o.block_size = 2;
  o.max_positions = 64;
  o.vocab_size = 100;
  return o;
}

StepPlan learn(uint64_t id, std::vector<int32_t> tokens, std::vector<int32_t> blocks) {
  StepPlan p;
  NewSequence ns;
  ns.seq_id = id;
  ns.tokens = std::move(tokens);
  ns.block_table = std::move(blocks);
  p.new_seqs.push_back(ns);
  p.work.push_back({id, 0, static_cast<int32_t>(p.new_seqs[0].tokens.size()), {}, true});
  return p;
}

// Runs the plan's chunks as if the model sampled token 7 for each.
void run(SequenceTable& t, const StepPlan& plan) {
  PreparedStep s = t.prepare(plan);
  ASSERT_TRUE(s.failures.empty()) << s.failures[0].error;
  std::vector<SeqOutput> out;
  for (const SeqChunk& c : s.chunks)
    if (c.sample) out.push_back({c.seq_id, SampledToken{7, 0.0f, {}}});
  t.commit(s, out, {});
}

// One decode step of `id` from `pos`, growing its table by `added`.
PreparedStep grow(SequenceTable& t, uint64_t id, int32_t pos, std::vector<int32_t> added) {
  StepPlan p;
  p.work.push_back({id, pos, 1, std::move(added), true});
  return t.prepare(p);
}

// Each block a table gains is checked against the blocks it holds and the
// others it gains: outside the pool, or named twice, the item fails alone and
// names the block; its sequence is forgotten.
TEST(SequenceTable, GrowingATableChecksEveryNewBlock) {
  struct Case {
    std::vector<int32_t> added;
    std::string words;
  };
  const std::vector<Case> cases = {
      {{1}, "names block 1 twice"},        // held since admission
      {{3, 3}, "names block 3 twice"},     // twice among the new
      {{3, 8}, "block 8 is outside"},      // past the pool
      {{-1}, "block -1 is outside"},       // negative
      {{3, 4, 0}, "names block 0 twice"},  // held, after good ones
  };
  for (const Case& c : cases) {
    SequenceTable t(options());
    run(t, learn(1, {5, 6, 7}, {0, 1}));  // 3 tokens + the sampled one: blocks 0, 1 full
    run(t, learn(2, {5}, {2}));
    const PreparedStep s = grow(t, 1, 3, c.added);
    ASSERT_EQ(s.failures.size(), 1u);
    EXPECT_EQ(s.failures[0].seq_id, 1u);
    EXPECT_NE(s.failures[0].error.find(c.words), std::string::npos) << s.failures[0].error;
    EXPECT_FALSE(t.contains(1));
    EXPECT_TRUE(t.contains(2)) << "another sequence's table is untouched";
    // The other sequence still grows, by a block the failed one named.
    const PreparedStep ok = grow(t, 2, 1, {3});
    ASSERT_TRUE(ok.failures.empty()) << ok.failures[0].error;
    EXPECT_EQ(ok.chunks[0].block_table, (std::vector<int32_t>{2, 3}));
  }
}

// A good growth appends to the table, and later steps check against it.
TEST(SequenceTable, AGrownTableIsCheckedWhole) {
  SequenceTable t(options());
  run(t, learn(1, {5, 6, 7}, {0, 1}));
  PreparedStep s = grow(t, 1, 3, {});
  ASSERT_TRUE(s.failures.empty());
  EXPECT_EQ(s.chunks[0].block_table, (std::vector<int32_t>{0, 1}));
  t.commit(s, {{1, SampledToken{7, 0.0f, {}}}}, {});
  s = grow(t, 1, 4, {5});
  ASSERT_TRUE(s.failures.empty()) << s.failures[0].error;
  EXPECT_EQ(s.chunks[0].block_table, (std::vector<int32_t>{0, 1, 5}));
  t.commit(s, {{1, SampledToken{7, 0.0f, {}}}}, {});
  run(t, StepPlan{});
  s = grow(t, 1, 5, {6, 5});
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_NE(s.failures[0].error.find("names block 5 twice"), std::string::npos) << s.failures[0].error;
}

// A new sequence's whole table is checked when it is learned.
TEST(SequenceTable, ANewTableIsCheckedWhole) {
  SequenceTable t(options());
  PreparedStep s = t.prepare(learn(1, {5, 6, 7}, {4, 4}));
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_NE(s.failures[0].error.find("names block 4 twice"), std::string::npos) << s.failures[0].error;
  s = t.prepare(learn(1, {5, 6, 7}, {4, 9}));
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_NE(s.failures[0].error.find("block 9 is outside the pool of 8"), std::string::npos)
      << s.failures[0].error;
  EXPECT_FALSE(t.contains(1));
}

}  // namespace
}  // namespace troupe::core
