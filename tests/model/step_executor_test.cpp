#include "model/step_executor.hpp"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/generate.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/text/tokenizer.hpp"
#include "model/weights.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

using core::SeqChunk;
using core::StepPlan;

struct Tiny {
  Gpt2Config cfg = Gpt2Config::preset("tiny");
  Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  Gpt2 model{cfg, Gpt2Weights::random(cfg, 1234), torch::kCPU};
};

const Tiny& tiny() {
  static Tiny t;
  return t;
}

constexpr int64_t kBlockSize = 4;
constexpr int64_t kNumBlocks = 64;

// One sequence as a scheduler would drive it: chunked prefill of at most
// `chunk` tokens per step, then one decode token per step.
struct Script {
  uint64_t id;
  std::vector<int32_t> tokens;  // prompt, then sampled ids
  size_t prompt_len;
  int32_t max_new;
  int first_step;             // step at which it joins
  SamplingParams sampling;
  int64_t computed = 0;       // tokens whose K/V is in the cache
  std::vector<int32_t> blocks;
  std::vector<int32_t> generated() const { return {tokens.begin() + prompt_len, tokens.end()}; }
  bool done() const { return static_cast<int32_t>(tokens.size() - prompt_len) >= max_new; }
};

// Runs the scripts to completion through one executor, handing out blocks
// from a shuffled free list so no sequence's blocks are contiguous.
void run(StepExecutor& ex, std::vector<Script>& scripts, int64_t chunk, uint32_t seed) {
  std::vector<int32_t> free_blocks(kNumBlocks);
  for (int32_t b = 0; b < kNumBlocks; ++b) free_blocks[b] = b;
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(seed));
  for (int step = 0; step < 1000; ++step) {
    std::vector<SeqChunk> plan;
    std::vector<Script*> in_plan;
    for (auto& s : scripts) {
      if (step < s.first_step || s.done()) continue;
      SeqChunk c;
      c.seq_id = s.id;
      c.start_pos = static_cast<int32_t>(s.computed);
      const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(s.tokens.size()) - s.computed);
      c.token_ids.assign(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
      while (static_cast<int64_t>(s.blocks.size()) * kBlockSize < s.computed + n) {
        s.blocks.push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      c.block_table = s.blocks;
      c.sample = s.computed + n == static_cast<int64_t>(s.tokens.size());
      c.sampling = s.sampling;
      plan.push_back(c);
      in_plan.push_back(&s);
    }
    if (plan.empty()) return;
    std::vector<core::SeqFailure> failures;
    const auto outputs = ex.run(plan, failures);
    ASSERT_TRUE(failures.empty());
    size_t out = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      Script& s = *in_plan[i];
      s.computed += static_cast<int64_t>(plan[i].token_ids.size());
      if (!plan[i].sample) continue;
      ASSERT_LT(out, outputs.size());
      ASSERT_EQ(outputs[out].seq_id, s.id);
      s.tokens.push_back(outputs[out].token.id);
      ++out;
    }
    ASSERT_EQ(out, outputs.size());
  }
  FAIL() << "scripts did not finish";
}

Script make(uint64_t id, const std::string& prompt, int32_t max_new, int first_step, SamplingParams p = {}) {
  Script s;
  s.id = id;
  s.tokens = tiny().tok.encode(prompt);
  s.prompt_len = s.tokens.size();
  s.max_new = max_new;
  s.first_step = first_step;
  s.sampling = p;
  return s;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

std::vector<int32_t> reference(const Script& s) {
  GenerateOptions o;
  o.max_tokens = s.max_new;
  o.sampling = s.sampling;
  o.ignore_eos = true;
  const std::vector<int32_t> prompt(s.tokens.begin(), s.tokens.begin() + s.prompt_len);
  return generate(tiny().model, tiny().tok, prompt, o, GenerateMode::kKv).ids;
}

class StepExecutorModes : public ::testing::TestWithParam<PagedAttention> {};

TEST_P(StepExecutorModes, ChunkedPrefillAndDecodesMatchGenerateAlone) {
  const auto& t = tiny();
  PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
  StepExecutor ex(t.model, cache, GetParam());
  SamplingParams seeded;
  seeded.temperature = 1.0f;
  seeded.top_k = 50;
  seeded.seed = 77;
  std::vector<Script> scripts = {
      make(11, "The first sequence has a longer prompt than the others here", 12, 0),
      make(22, "Second one", 15, 0),
      make(33, "A late arrival joins midway", 9, 4, seeded),
  };
  ASSERT_GT(scripts[0].prompt_len, 2 * 5u);  // at least three prefill chunks
  run(ex, scripts, 5, 1);
  for (const auto& s : scripts) EXPECT_EQ(s.generated(), reference(s)) << "seq " << s.id;
}

INSTANTIATE_TEST_SUITE_P(Attention, StepExecutorModes,
                         ::testing::Values(PagedAttention::kKernel, PagedAttention::kGather),
                         [](const auto& info) { return info.param == PagedAttention::kKernel ? "Kernel" : "Gather"; });

TEST(StepExecutor, SeededSequenceDrawsTheSameTokensAloneOrInABatch) {
  const auto& t = tiny();
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 4242;
  p.logprobs = 1;
  std::vector<int32_t> alone_ids;
  {
    PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
    StepExecutor ex(t.model, cache);
    std::vector<Script> alone = {make(5, "Seeded sampling must not care about neighbours", 16, 0, p)};
    run(ex, alone, 64, 2);
    alone_ids = alone[0].generated();
  }
  PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
  StepExecutor ex(t.model, cache);
  SamplingParams other = p;
  other.seed = 1;
  std::vector<Script> batch = {
      make(1, "Some neighbour with different params", 20, 0, other),
      make(2, "Another, greedy", 10, 1, greedy()),
      make(5, "Seeded sampling must not care about neighbours", 16, 2, p),
  };
  run(ex, batch, 3, 3);  // other chunking, other blocks, other rows
  EXPECT_EQ(batch[2].generated(), alone_ids);
  EXPECT_EQ(batch[2].generated(), reference(batch[2]));
  EXPECT_NE(batch[0].generated(), alone_ids);
}

// A bfloat16 KV cache (--kv-cache-dtype bfloat16): a seeded sequence draws
// the same tokens alone or in a batch, chunked otherwise, through the
// kernel or the gather path; and the cache does hold bfloat16.
TEST(StepExecutor, BfloatKvDrawsTheSameTokensAloneOrInABatchOnBothPaths) {
  const auto& t = tiny();
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 99;
  std::vector<int32_t> alone_ids;
  {
    PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize, torch::kCPU, KvDtype::kBFloat16);
    StepExecutor ex(t.model, cache);
    std::vector<Script> alone = {make(5, "Rounded keys and values must not care about neighbours", 16, 0, p)};
    run(ex, alone, 64, 2);
    alone_ids = alone[0].generated();
    EXPECT_EQ(cache.k(0).scalar_type(), torch::kBFloat16);
    EXPECT_GT(cache.k(0).to(torch::kFloat32).abs().sum().item<float>(), 0.f) << "the cache was written";
  }
  ASSERT_EQ(alone_ids.size(), 16u);
  for (PagedAttention path : {PagedAttention::kKernel, PagedAttention::kGather}) {
    PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize, torch::kCPU, KvDtype::kBFloat16);
    StepExecutor ex(t.model, cache, path);
    SamplingParams other = p;
    other.seed = 1;
    std::vector<Script> batch = {
        make(1, "Some neighbour with different params", 20, 0, other),
        make(2, "Another, greedy", 10, 1, greedy()),
        make(5, "Rounded keys and values must not care about neighbours", 16, 2, p),
    };
    run(ex, batch, 3, 3);
    EXPECT_EQ(batch[2].generated(), alone_ids) << (path == PagedAttention::kKernel ? "kernel" : "gather");
  }
}

// int8 and bfloat16 weights (bfloat16 on vdpbf16ps where the CPU has it,
// its inputs rounded): greedy tokens do not depend on the batch
// (neighbours, chunking, rows, blocks) either, and equal generate()'s alone.
void expect_greedy_batch_independent(WeightDtype dtype) {
  const auto& t = tiny();
  const Gpt2 q8(t.cfg, Gpt2Weights::random(t.cfg, 1234), torch::kCPU, dtype);
  const std::vector<std::string> prompts = {"The first sequence has a longer prompt than the others here",
                                            "Second one", "A late arrival joins midway"};
  std::vector<Script> batch;
  for (size_t i = 0; i < prompts.size(); ++i)
    batch.push_back(
        make(i + 1, prompts[i], 14 - 2 * static_cast<int32_t>(i), static_cast<int>(2 * i), greedy()));
  {
    PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
    StepExecutor ex(q8, cache);
    run(ex, batch, 3, 5);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Script& s = batch[i];
    std::vector<Script> alone = {make(s.id, prompts[i], s.max_new, 0, greedy())};
    PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
    StepExecutor ex(q8, cache);
    run(ex, alone, 64, 6);
    EXPECT_EQ(s.generated(), alone[0].generated()) << "seq " << s.id;
    GenerateOptions o;
    o.max_tokens = s.max_new;
    o.sampling = greedy();
    o.ignore_eos = true;
    const std::vector<int32_t> prompt(s.tokens.begin(),
                                      s.tokens.begin() + static_cast<int64_t>(s.prompt_len));
    EXPECT_EQ(s.generated(), generate(q8, t.tok, prompt, o, GenerateMode::kKv).ids) << "seq " << s.id;
  }
}

TEST(StepExecutor, LowPrecisionGreedyTokensAreTheSameAloneAndInABatch) {
  for (WeightDtype dtype : {WeightDtype::kInt8, WeightDtype::kBFloat16}) {
    SCOPED_TRACE(to_string(dtype));
    expect_greedy_batch_independent(dtype);
  }
}

TEST(StepExecutor, ResultFollowsPlanOrderWithLogprobsAndTiming) {
  const auto& t = tiny();
  PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
  StepExecutor ex(t.model, cache);
  SeqChunk a;
  a.seq_id = 100;
  a.token_ids = {464, 2068, 7586};
  a.block_table = {7};
  a.sample = false;  // a prefill chunk that does not finish its prompt
  SeqChunk b;
  b.seq_id = 200;
  b.token_ids = {15496, 995};
  b.block_table = {3, 60};
  b.sample = true;
  b.sampling.temperature = 0.0f;
  b.sampling.logprobs = 3;
  SeqChunk c = b;
  c.seq_id = 300;
  c.block_table = {12};
  c.sampling.logprobs = -1;
  const std::vector<SeqChunk> plan = {a, b, c};
  std::vector<core::SeqFailure> failures;
  const auto outputs = ex.run(plan, failures);
  EXPECT_TRUE(failures.empty());
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0].seq_id, 200u);
  EXPECT_EQ(outputs[1].seq_id, 300u);
  EXPECT_EQ(outputs[0].token.id, outputs[1].token.id);  // same tokens, same place
  ASSERT_EQ(outputs[0].token.top.size(), 3u);
  EXPECT_EQ(outputs[0].token.top[0].first, outputs[0].token.id);
  EXPECT_LT(outputs[0].token.logprob, 0.0f);
  EXPECT_TRUE(outputs[1].token.top.empty());
  const auto logits = t.model.forward_full({15496, 995});
  EXPECT_EQ(outputs[0].token.id, logits[1].argmax().item<int64_t>());
  // The flat batch the plan became.
  const FlatBatch fb = ex.flatten(plan);
  EXPECT_EQ(fb.query_start, (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_EQ(fb.context_lens, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(fb.sample_rows, (std::vector<int64_t>{4, 6}));
  EXPECT_TRUE(fb.slot_mapping.equal(torch::tensor({28, 29, 30, 12, 13, 48, 49}, torch::kLong)));
  EXPECT_TRUE(fb.positions.equal(torch::tensor({0, 1, 2, 0, 1, 0, 1}, torch::kLong)));
  EXPECT_EQ(ex.run({}, failures).size(), 0u);
}

TEST(StepExecutor, PromptScoresComeAFewRowsAtATimeAndEqualAFullForward) {
  const auto& t = tiny();
  PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
  StepExecutor ex(t.model, cache);
  ex.set_score_rows_per_call(16);  // 40 rows: three LM-head calls
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, 50000);
  std::vector<int32_t> prompt(41);
  for (auto& x : prompt) x = id(rng);
  SeqChunk a;  // the first 40 tokens: rows 0..39 score positions 1..40
  a.seq_id = 1;
  a.token_ids.assign(prompt.begin(), prompt.begin() + 40);
  for (int32_t b = 0; b < 11; ++b) a.block_table.push_back(20 + b);
  a.sampling.prompt_logprobs = 2;
  a.score_ids.assign(prompt.begin() + 1, prompt.end());
  SeqChunk d;  // a decode beside it that samples
  d.seq_id = 2;
  d.token_ids = {464, 2068};
  d.block_table = {5};
  d.sample = true;
  d.sampling.temperature = 0.0f;
  std::vector<core::SeqFailure> failures;
  std::vector<core::PromptScores> scores;
  const auto outputs = ex.run({a, d}, failures, scores);
  EXPECT_TRUE(failures.empty());
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].token.id, t.model.forward_full({464, 2068})[1].argmax().item<int64_t>());
  ASSERT_EQ(scores.size(), 1u);
  EXPECT_EQ(scores[0].seq_id, 1u);
  EXPECT_EQ(scores[0].start, 1);
  ASSERT_EQ(scores[0].tokens.size(), 40u);
  const torch::Tensor lsm = torch::log_softmax(t.model.forward_full(prompt).to(torch::kDouble), 1);
  for (int64_t p = 1; p <= 40; ++p) {
    const core::SampledToken& s = scores[0].tokens[p - 1];
    EXPECT_EQ(s.id, prompt[p]);
    EXPECT_NEAR(s.logprob, lsm[p - 1][prompt[p]].item<double>(), 1e-4) << "position " << p;
    EXPECT_GE(s.rank, 1);
    ASSERT_EQ(s.top.size(), 2u);
    EXPECT_EQ(s.top[0].first, lsm[p - 1].argmax().item<int64_t>());
  }
  // The two-argument run refuses to drop scores.
  SeqChunk again = a;
  again.seq_id = 3;
  again.block_table.clear();
  for (int32_t b = 0; b < 11; ++b) again.block_table.push_back(40 + b);
  EXPECT_THROW(ex.run({again}, failures), std::logic_error);
  // More score ids than rows is a bad plan.
  again.score_ids.push_back(1);
  again.score_ids.insert(again.score_ids.end(), 5, 1);
  EXPECT_THROW(ex.run({again}, failures, scores), std::invalid_argument);
}

TEST(StepExecutor, ImpossiblePlansNameTheSequenceAndLeaveTheCacheAlone) {
  const auto& t = tiny();
  PagedKvCache cache(t.cfg, 8, kBlockSize);
  StepExecutor ex(t.model, cache);
  auto k0 = cache.k(0).clone();
  SeqChunk good;
  good.seq_id = 1;
  good.token_ids = {464, 2068};
  good.block_table = {0};
  good.sample = true;
  auto expect_bad = [&](SeqChunk bad, const std::string& words) {
    bad.seq_id = 7;
    std::vector<core::SeqFailure> failures;
    try {
      ex.run({good, bad}, failures);
      ADD_FAILURE() << "accepted a plan that should fail with: " << words;
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("seq 7"), std::string::npos) << m;
      EXPECT_NE(m.find(words), std::string::npos) << m;
    }
    EXPECT_TRUE(cache.k(0).equal(k0)) << "the cache was written before the check failed";
  };
  SeqChunk c;
  c.block_table = {1};
  c.token_ids = {50257};
  expect_bad(c, "vocabulary");
  c.token_ids = {-1};
  expect_bad(c, "vocabulary");
  c.token_ids = {};
  expect_bad(c, "no tokens");
  c.token_ids = {1, 2, 3, 4, 5};
  expect_bad(c, "block table holds 1");
  c.block_table = {1, 8};
  expect_bad(c, "outside the pool");
  c.block_table = {1, 1};
  expect_bad(c, "twice");
  c.block_table = {1, 0};
  expect_bad(c, "slot");  // block 0 is good's
  c = SeqChunk{};
  c.token_ids = {1};
  c.start_pos = 128;
  c.block_table = std::vector<int32_t>(33, 2);
  expect_bad(c, "n_positions");
  c.start_pos = -1;
  expect_bad(c, "negative");
  c.start_pos = 0;
  c.block_table = {2};
  c.sample = true;
  c.sampling.top_k = -3;
  expect_bad(c, "top_k");
  c.sampling.top_k = 0;
  std::vector<core::SeqFailure> failures;
  EXPECT_THROW(ex.run({good, good}, failures), std::invalid_argument);
  EXPECT_TRUE(cache.k(0).equal(k0));
  // A good plan does write.
  ex.run({good}, failures);
  EXPECT_FALSE(cache.k(0).equal(k0));
}

// The worker's whole protocol: a sequence is sent once, then only deltas; the
// worker feeds its own samples; a bad work item fails alone.
// Step 1 of a delta plan: sequence s.id joins with `blocks` and its whole
// prompt runs, sampling (greedy).
StepPlan prefill_plan(const Script& s, std::vector<int32_t> blocks) {
  StepPlan p;
  p.step_id = 1;
  core::NewSequence ns;
  ns.seq_id = s.id;
  ns.tokens = s.tokens;
  ns.block_table = std::move(blocks);
  ns.sampling = greedy();
  p.new_seqs.push_back(ns);
  p.work.push_back({s.id, 0, static_cast<int32_t>(s.prompt_len), {}, true});
  return p;
}

// execute() hands the heap's free pages back in the step after a large one
// (core::HeapTrimPolicy), once, and the tokens are the same as without.
TEST(StepExecutor, ReleasesTheHeapAfterALargeStepWithTheSameTokens) {
  const auto& t = tiny();
  auto drive = [&](int64_t trim_tokens, int64_t& releases) {
    PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
    StepExecutor ex(t.model, cache);
    ex.set_heap_trim_tokens(trim_tokens);
    Script s = make(1, "A prompt long enough to count as a large step for a tiny threshold", 5, 0, greedy());
    const int32_t n = static_cast<int32_t>(s.prompt_len);
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b * kBlockSize < n + 5; ++b) blocks.push_back(b);
    auto r = ex.execute(prefill_plan(s, blocks));
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(ex.heap_releases(), 0);  // not before the large step
    std::vector<int32_t> got{r.outputs.at(0).token.id};
    for (int32_t k = 1; k < 5; ++k) {
      StepPlan p;
      p.step_id = 1 + static_cast<uint64_t>(k);
      p.work.push_back({1, n + k - 1, 1, {}, true});
      r = ex.execute(p);
      EXPECT_TRUE(r.error.empty() && r.failures.empty());
      got.push_back(r.outputs.at(0).token.id);
    }
    releases = ex.heap_releases();
    EXPECT_EQ(got, reference(s));
    return got;
  };
  int64_t with = -1, without = -1;
  const auto a = drive(8, with);
  const auto b = drive(0, without);
  EXPECT_EQ(with, 1);
  EXPECT_EQ(without, 0);
  EXPECT_EQ(a, b);
}

// execute() has the cache map its pools past the highest block a step
// writes (PagedKvCache::map_ahead), not past blocks the step only reads,
// and the tokens are the same as without.
TEST(StepExecutor, MapsTheKvPoolsAheadOfTheBlocksItWrites) {
  const auto& t = tiny();
  // The tiny model's blocks of 4 tokens: 1 KiB of each pool, 2048 to a 2 MiB page.
  constexpr int64_t kBlocks = 16384, kMiB = int64_t{1} << 20;
  auto drive = [&](bool prefault, std::vector<int64_t>& asked) {
    PagedKvCache cache(t.cfg, kBlocks, kBlockSize);
    StepExecutor ex(t.model, cache);
    ex.set_kv_prefault(prefault ? KvPrefault::kAhead : KvPrefault::kOff);
    asked.push_back(cache.mapped_ahead_bytes());
    Script s = make(1, "Blocks far into the pool", 6, 0, greedy());
    const int32_t n = static_cast<int32_t>(s.prompt_len);
    std::vector<int32_t> blocks;  // the prompt's blocks from 5000 up; its decodes in block 9000
    for (int32_t b = 0; b * kBlockSize < n; ++b) blocks.push_back(5000 + b);
    const int32_t grow_at = static_cast<int32_t>(blocks.size()) * kBlockSize;
    auto r = ex.execute(prefill_plan(s, blocks));
    EXPECT_TRUE(r.error.empty()) << r.error;
    asked.push_back(cache.mapped_ahead_bytes());
    std::vector<int32_t> got{r.outputs.at(0).token.id};
    for (int32_t k = 1; k < 6; ++k) {
      StepPlan p;
      p.step_id = 1 + static_cast<uint64_t>(k);
      p.work.push_back({1, n + k - 1, 1, {}, true});
      if (n + k - 1 == grow_at) p.work.back().new_blocks = {9000};
      r = ex.execute(p);
      EXPECT_TRUE(r.error.empty() && r.failures.empty()) << r.error;
      got.push_back(r.outputs.at(0).token.id);
      asked.push_back(cache.mapped_ahead_bytes());
    }
    EXPECT_EQ(got, reference(s));
    return got;
  };
  std::vector<int64_t> on, off;
  const auto a = drive(true, on);
  const auto b = drive(false, off);
  EXPECT_EQ(a, b);
  EXPECT_EQ(on.front(), 0);  // nothing before the first step: an idle worker holds no pool pages
  // The prompt wrote blocks 5000 up to ~5008: 4.9 MiB + 10 KiB -> 6 MiB.
  EXPECT_EQ(on.at(1), 6 * kMiB);
  // A decode that starts block 9000 (8.8 MiB + 10 KiB) asks for 10 MiB; the
  // decodes before it, writing the prompt's last block, for nothing more.
  EXPECT_EQ(on.back(), 10 * kMiB);
  EXPECT_TRUE(std::is_sorted(on.begin(), on.end()));
  EXPECT_EQ(off, std::vector<int64_t>(off.size(), 0));
}

// TROUPE_KV_PREFAULT=all: the executor has the cache map every pool whole
// at once (not waiting for it); steps then ask for nothing more, and give the
// same tokens.
TEST(StepExecutor, WholeMappingMapsEveryPoolBeforeAnyStep) {
  const auto& t = tiny();
  constexpr int64_t kBlocks = 4096;
  PagedKvCache cache(t.cfg, kBlocks, kBlockSize);
  const int64_t pool = PagedKvCache::bytes_per_block(t.cfg, kBlockSize) / (2 * t.cfg.n_layer) * kBlocks;
  StepExecutor ex(t.model, cache);
  ex.set_kv_prefault(KvPrefault::kOff);
  EXPECT_EQ(cache.mapped_ahead_bytes(), 0);
  ex.set_kv_prefault(KvPrefault::kWhole);
  EXPECT_EQ(cache.mapped_ahead_bytes(), pool);
  cache.wait_mapped();
  if (test::kernel_populates()) {
    for (int l = 0; l < t.cfg.n_layer; ++l)
      EXPECT_EQ(test::resident_bytes(cache.k(l).data_ptr(), static_cast<size_t>(pool)), pool)
          << "layer " << l;
  }
  Script s = make(1, "Whole pools", 4, 0, greedy());
  std::vector<int32_t> blocks;
  for (int32_t b = 0; b * kBlockSize < static_cast<int32_t>(s.prompt_len) + 4; ++b)
    blocks.push_back(4000 + b);
  auto r = ex.execute(prefill_plan(s, blocks));
  ASSERT_TRUE(r.error.empty()) << r.error;
  std::vector<int32_t> got{r.outputs.at(0).token.id};
  for (int32_t k = 1; k < 4; ++k) {
    StepPlan p;
    p.step_id = 1 + static_cast<uint64_t>(k);
    p.work.push_back({1, static_cast<int32_t>(s.prompt_len) + k - 1, 1, {}, true});
    r = ex.execute(p);
    ASSERT_TRUE(r.error.empty() && r.failures.empty()) << r.error;
    got.push_back(r.outputs.at(0).token.id);
  }
  EXPECT_EQ(got, reference(s));
  EXPECT_EQ(cache.mapped_ahead_bytes(), pool);
}

TEST(StepExecutor, DeltaPlansDriveTheSequenceTableAndMatchGenerate) {
  const auto& t = tiny();
  PagedKvCache cache(t.cfg, kNumBlocks, kBlockSize);
  StepExecutor ex(t.model, cache);
  Script s = make(1, "Plans carry only what changed", 6, 0, greedy());
  const int32_t n = static_cast<int32_t>(s.prompt_len);
  const StepPlan p1 = prefill_plan(s, {10, 11, 12});
  const core::NewSequence& ns = p1.new_seqs[0];
  auto r = ex.execute(p1);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.outputs.size(), 1u);
  std::vector<int32_t> got{r.outputs[0].token.id};
  int32_t pos = n;
  std::vector<int32_t> blocks{10, 11, 12};
  for (int k = 1; k < 6; ++k, ++pos) {
    StepPlan p;
    p.step_id = 1 + static_cast<uint64_t>(k);
    core::SeqWork w{1, pos, 1, {}, true};
    if (pos / kBlockSize >= static_cast<int32_t>(blocks.size())) {
      w.new_blocks = {20 + k};
      blocks.push_back(20 + k);
    }
    p.work.push_back(w);
    r = ex.execute(p);
    ASSERT_TRUE(r.failures.empty()) << r.failures[0].error;
    ASSERT_EQ(r.outputs.size(), 1u);
    got.push_back(r.outputs[0].token.id);
  }
  EXPECT_EQ(got, reference(s));
  EXPECT_EQ(ex.sequences().num_computed(1), pos);

  // A work item that disagrees with the worker fails alone; the other runs.
  StepPlan bad;
  bad.step_id = 99;
  core::NewSequence other = ns;
  other.seq_id = 2;
  other.block_table = {40, 41, 42};
  bad.new_seqs.push_back(other);
  bad.work.push_back({1, pos + 3, 1, {}, true});  // wrong position
  bad.work.push_back({2, 0, n, {}, true});
  r = ex.execute(bad);
  EXPECT_TRUE(r.error.empty());
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].seq_id, 1u);
  EXPECT_TRUE(r.failures[0].retryable);
  EXPECT_NE(r.failures[0].error.find("position"), std::string::npos) << r.failures[0].error;
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].seq_id, 2u);
  EXPECT_EQ(r.outputs[0].token.id, got[0]) << "same prompt, same first token";
  EXPECT_FALSE(ex.sequences().contains(1));
  // Unknown sequences and drops.
  StepPlan later;
  later.step_id = 100;
  later.drop = {2};
  later.work.push_back({2, n + 1, 1, {}, true});
  r = ex.execute(later);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].error.find("does not hold"), std::string::npos) << r.failures[0].error;
  EXPECT_EQ(ex.sequences().size(), 0u);
}

}  // namespace
}  // namespace troupe::model
