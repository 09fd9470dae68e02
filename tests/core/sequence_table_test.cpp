// SequenceTable: a worker's checking of step plans, without a model.
#include <gtest/gtest.h>

#include <climits>
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
    if (c.sample) out.push_back({c.seq_id, SampledToken{7, 0.0f, {}, 0}});
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
  t.commit(s, {{1, SampledToken{7, 0.0f, {}, 0}}}, {});
  s = grow(t, 1, 4, {5});
  ASSERT_TRUE(s.failures.empty()) << s.failures[0].error;
  EXPECT_EQ(s.chunks[0].block_table, (std::vector<int32_t>{0, 1, 5}));
  t.commit(s, {{1, SampledToken{7, 0.0f, {}, 0}}}, {});
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

// KV writes are checked slot by slot within one step: an item writing a slot
// an earlier item of the step writes is refused alone; writing another slot
// of the same block is not a clash; a refused item writes nothing.
TEST(SequenceTable, AnItemWritingAnotherItemsSlotFailsAlone) {
  SequenceTable t(options());                // 2 slots per block
  StepPlan p = learn(1, {5, 6, 7}, {0, 1});  // writes block 0 slots 0-1, block 1 slot 0
  StepPlan two = learn(2, {5}, {1});         // block 1 slot 0: seq 1's
  p.new_seqs.push_back(two.new_seqs[0]);
  p.work.push_back(two.work[0]);
  StepPlan three = learn(3, {5, 6}, {2});  // block 2 slots 0-1: nobody's
  p.new_seqs.push_back(three.new_seqs[0]);
  p.work.push_back(three.work[0]);
  PreparedStep s = t.prepare(p);
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_EQ(s.failures[0].seq_id, 2u);
  EXPECT_NE(s.failures[0].error.find("writes a KV slot that another sequence writes"), std::string::npos)
      << s.failures[0].error;
  ASSERT_EQ(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks[0].seq_id, 1u);
  EXPECT_EQ(s.chunks[1].seq_id, 3u);

  // Another slot of a block written in the step is no clash.
  SequenceTable u(options());
  run(u, learn(1, {5}, {0}));  // computed 1: next writes block 0 slot 1
  StepPlan q;
  q.work.push_back({1, 1, 1, {}, true});
  StepPlan other = learn(2, {5}, {0});  // block 0 slot 0
  q.new_seqs.push_back(other.new_seqs[0]);
  q.work.push_back(other.work[0]);
  s = u.prepare(q);
  EXPECT_TRUE(s.failures.empty()) << s.failures[0].error;
  EXPECT_EQ(s.chunks.size(), 2u);

  // A refused item (here one clashing in its first block) leaves its later
  // blocks free for the items after it.
  SequenceTable v(options());
  StepPlan r = learn(1, {5, 6}, {0});        // block 0 slots 0-1
  StepPlan b = learn(2, {5, 6, 7}, {0, 3});  // block 0 (clash), then block 3 slot 0
  StepPlan c = learn(3, {5}, {3});           // block 3 slot 0: free, since 2 did not run
  for (const StepPlan* x : {&b, &c}) {
    r.new_seqs.push_back(x->new_seqs[0]);
    r.work.push_back(x->work[0]);
  }
  s = v.prepare(r);
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_EQ(s.failures[0].seq_id, 2u);
  ASSERT_EQ(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks[1].seq_id, 3u);
}

// A sequence named twice in one step's work runs once; the second item fails
// (also when the first was refused: unknown, or gone with its refusal).
TEST(SequenceTable, ASequenceNamedTwiceInAStepRunsOnce) {
  SequenceTable t(options());
  run(t, learn(1, {5, 6, 7}, {0, 1}));
  StepPlan p;
  p.work.push_back({1, 3, 1, {2}, true});
  p.work.push_back({1, 3, 1, {}, true});
  p.work.push_back({9, 0, 1, {}, true});
  p.work.push_back({9, 0, 1, {}, true});
  PreparedStep s = t.prepare(p);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].seq_id, 1u);
  ASSERT_EQ(s.failures.size(), 3u);
  EXPECT_NE(s.failures[0].error.find("seq 1 appears twice"), std::string::npos) << s.failures[0].error;
  EXPECT_NE(s.failures[1].error.find("does not hold"), std::string::npos) << s.failures[1].error;
  EXPECT_NE(s.failures[2].error.find("seq 9 appears twice"), std::string::npos) << s.failures[2].error;
  EXPECT_TRUE(t.contains(1));
  // The next step may name it again.
  t.commit(s, {{1, SampledToken{7, 0.0f, {}, 0}}}, {});
  s = grow(t, 1, 4, {});
  EXPECT_TRUE(s.failures.empty()) << s.failures[0].error;
}

// A plan claiming absurd token counts fails its items, and costs no memory
// in proportion to the claim.
TEST(SequenceTable, AbsurdTokenCountsFailTheirItemsOnly) {
  SequenceTable t(options());
  run(t, learn(1, {5, 6, 7}, {0, 1}));
  run(t, learn(2, {5}, {2}));
  StepPlan p;
  p.work.push_back({1, 3, INT32_MAX, {}, true});
  p.work.push_back({2, 1, 1, {3}, true});
  p.work.push_back({3, 0, -7, {}, true});
  const PreparedStep s = t.prepare(p);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].seq_id, 2u);
  ASSERT_EQ(s.failures.size(), 2u);
  EXPECT_NE(s.failures[0].error.find("plan runs 2147483647 tokens"), std::string::npos)
      << s.failures[0].error;
}

// prepare() into a kept PreparedStep gives what a fresh one gets, whatever
// the previous step left in it.
TEST(SequenceTable, PreparingIntoAKeptStepReplacesItsContents) {
  SequenceTable a(options()), b(options());
  PreparedStep kept;
  StepPlan p1 = learn(1, {5, 6, 7}, {0, 1});
  StepPlan extra = learn(2, {5}, {2});
  p1.new_seqs.push_back(extra.new_seqs[0]);
  p1.work.push_back(extra.work[0]);
  StepPlan bad;
  bad.work.push_back({4, 0, 1, {}, true});  // unknown: a failure
  p1.work.push_back(bad.work[0]);
  a.prepare(p1, kept);
  const PreparedStep fresh1 = b.prepare(p1);
  ASSERT_EQ(kept.chunks.size(), 2u);
  ASSERT_EQ(kept.failures.size(), 1u);
  std::vector<SeqOutput> out = {{1, SampledToken{7, 0.0f, {}, 0}}, {2, SampledToken{7, 0.0f, {}, 0}}};
  a.commit(kept, out, {});
  b.commit(fresh1, out, {});
  StepPlan p2;
  p2.step_id = 2;
  p2.work.push_back({2, 1, 1, {3}, true});
  a.prepare(p2, kept);
  const PreparedStep fresh2 = b.prepare(p2);
  EXPECT_EQ(kept.step_id, 2u);
  EXPECT_TRUE(kept.failures.empty());
  ASSERT_EQ(kept.chunks.size(), 1u);
  EXPECT_EQ(kept.chunks[0].seq_id, 2u);
  EXPECT_EQ(kept.chunks[0].token_ids, fresh2.chunks[0].token_ids);
  EXPECT_EQ(kept.chunks[0].block_table, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(kept.chunks[0].start_pos, 1);
}

// A sequence that penalises repeats gets, with each sampling chunk, the
// tokens generated so far: those it was sent as generated (a resumed
// sequence), then those the worker sampled itself; the prompt's too only
// under a repetition penalty. One that does not penalise gets none.
TEST(SequenceTable, PenalisingSequencesCarryTheirGeneratedTokens) {
  SequenceTable t(options());
  StepPlan p = learn(1, {10, 11, 12, 13, 14}, {0, 1, 2});
  p.new_seqs[0].num_generated = 2;  // 13 and 14 were generated before a preemption
  p.new_seqs[0].sampling.presence_penalty = 1.0f;
  NewSequence plain;
  plain.seq_id = 2;
  plain.tokens = {20, 21};
  plain.block_table = {3};
  p.new_seqs.push_back(plain);
  p.work.push_back({2, 0, 2, {}, true});
  PreparedStep s = t.prepare(p);
  ASSERT_TRUE(s.failures.empty()) << s.failures[0].error;
  ASSERT_EQ(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks[0].history, (std::vector<int32_t>{13, 14}));
  EXPECT_EQ(s.chunks[0].history_prompt, 0);
  EXPECT_TRUE(s.chunks[1].history.empty());
  t.commit(s, {{1, SampledToken{7, 0.0f, {}, 0}}, {2, SampledToken{7, 0.0f, {}, 0}}}, {});
  s = grow(t, 1, 5, {});
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].history, (std::vector<int32_t>{13, 14, 7}));
  // A prefill chunk that does not sample carries nothing.
  StepPlan chunked = learn(3, {30, 31, 32, 33}, {4, 5});
  chunked.new_seqs[0].sampling.frequency_penalty = 0.5f;
  chunked.work[0].num_tokens = 2;
  chunked.work[0].sample = false;
  s = t.prepare(chunked);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_TRUE(s.chunks[0].history.empty());
  // A repetition penalty looks at the prompt as well.
  StepPlan repeat = learn(4, {40, 41, 42, 43}, {6, 7});
  repeat.new_seqs[0].num_generated = 1;
  repeat.new_seqs[0].sampling.repetition_penalty = 1.3f;
  s = t.prepare(repeat);
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_EQ(s.chunks[0].history, (std::vector<int32_t>{40, 41, 42, 43}));
  EXPECT_EQ(s.chunks[0].history_prompt, 3);
}

TEST(SequenceTable, ANewSequenceWithBadAdjustmentsIsRefused) {
  struct Case {
    int32_t num_generated;
    std::vector<std::pair<int32_t, float>> bias;
    std::string words;
  };
  const std::vector<Case> cases = {
      {3, {}, "num_generated 3 must leave a prompt"},
      {-1, {}, "num_generated -1 must leave a prompt"},
      {0, {{100, 1.0f}}, "logit_bias names token 100, outside the vocabulary [0, 100)"},
      {0, {{5, 1.0f}, {2, 1.0f}}, "strictly increasing"},
  };
  for (const Case& c : cases) {
    SequenceTable t(options());
    StepPlan p = learn(1, {10, 11, 12}, {0, 1});
    p.new_seqs[0].num_generated = c.num_generated;
    p.new_seqs[0].sampling.logit_bias = c.bias;
    const PreparedStep s = t.prepare(p);
    ASSERT_EQ(s.failures.size(), 1u) << c.words;
    EXPECT_NE(s.failures[0].error.find(c.words), std::string::npos) << s.failures[0].error;
    EXPECT_FALSE(t.contains(1));
  }
}

// advance() (a worker without a model: one pass, no chunks) refuses what
// prepare() refuses, for the same reasons, and leaves the table as prepare()
// then commit() do: the refused items' sequences forgotten, the others
// advanced by their tokens and the token sampled after them.
TEST(SequenceTable, AdvanceRefusesAndAdvancesAsPrepareThenCommit) {
  SequenceTable a(options()), b(options());  // 8 blocks of 2 slots
  const auto token = [](uint64_t id, int32_t pos) { return static_cast<int32_t>(id * 10 + pos) % 100; };
  std::vector<SeqFailure> refused;
  auto both = [&](const StepPlan& p) {
    const PreparedStep s = a.prepare(p);
    std::vector<SeqOutput> out;
    for (const SeqChunk& c : s.chunks)
      if (c.sample)
        out.push_back(
            {c.seq_id,
             SampledToken{
                 token(c.seq_id, c.start_pos + static_cast<int32_t>(c.token_ids.size())), 0.0f, {}, 0}});
    a.commit(s, out, {});
    EXPECT_EQ(b.advance(p, refused, token), s.failures.empty());
    EXPECT_EQ(refused.size(), s.failures.size());
    for (size_t i = 0; i < std::min(refused.size(), s.failures.size()); ++i) {
      EXPECT_EQ(refused[i].seq_id, s.failures[i].seq_id) << i;
      EXPECT_EQ(refused[i].error, s.failures[i].error) << i;
      EXPECT_EQ(refused[i].retryable, s.failures[i].retryable) << i;
    }
    EXPECT_EQ(a.size(), b.size());
    for (uint64_t id = 1; id <= 9; ++id) {
      EXPECT_EQ(a.contains(id), b.contains(id)) << id;
      EXPECT_EQ(a.num_computed(id), b.num_computed(id)) << id;
      EXPECT_EQ(a.tokens(id), b.tokens(id)) << id;
    }
    return s.failures.size();
  };
  StepPlan p = learn(1, {5, 6, 7}, {0, 1});  // blocks 0-1
  StepPlan two = learn(2, {5}, {2});         // block 2
  p.new_seqs.push_back(two.new_seqs[0]);
  p.work.push_back(two.work[0]);
  p.work.back().sample = false;  // a prefill chunk that samples nothing
  EXPECT_EQ(both(p), 0u);

  StepPlan q;
  q.work.push_back({1, 3, 1, {}, true});           // decode at 3: block 1 slot 1
  q.work.push_back({1, 4, 1, {3}, true});          // seq 1 again: refused, not run
  q.work.push_back({2, 0, 1, {}, true});           // computed 1, not 0: refused, forgotten
  q.work.push_back({9, 0, 1, {}, true});           // unknown
  StepPlan three = learn(3, {5, 6, 7}, {4, 99});   // a block outside the pool
  StepPlan four = learn(4, {5, 6}, {1});           // block 1 slot 0-1: seq 1 writes slot 1
  StepPlan five = learn(5, {5, 6, 7, 8}, {5, 6});  // fine
  for (const StepPlan* x : {&three, &four, &five}) {
    q.new_seqs.push_back(x->new_seqs[0]);
    q.work.push_back(x->work[0]);
  }
  EXPECT_EQ(both(q), 5u);
  EXPECT_TRUE(b.contains(1));
  EXPECT_FALSE(b.contains(2));
  EXPECT_EQ(b.tokens(5), (std::vector<int32_t>{5, 6, 7, 8, 54}));

  StepPlan r;  // the survivors go on
  r.work.push_back({1, 4, 1, {3}, true});
  r.work.push_back({5, 4, 1, {7}, true});
  EXPECT_EQ(both(r), 0u);
  EXPECT_EQ(b.num_computed(5), 5);
}

}  // namespace
}  // namespace troupe::core
