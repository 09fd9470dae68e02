// The engine end to end on a tiny random GPT-2: many requests sharing steps
// (continuous batching, chunked prefill, preemption, prefix caching) must each
// produce exactly what the contiguous-KV reference loop gives them alone.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "actors/engine.hpp"
#include "model/generate.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/weights.hpp"
#include "test_utils.hpp"

namespace troupe::actors {
namespace {

struct Tiny {
  model::Gpt2Config cfg = model::Gpt2Config::preset("tiny");
  model::Gpt2 gpt{cfg, model::Gpt2Weights::random(cfg, 99), torch::kCPU};
  model::Tokenizer tok = model::Tokenizer::from_dir(test::tokenizer_dir());
};

const Tiny& tiny() {
  static Tiny t;
  return t;
}

SchedulerOptions small_options(int32_t num_blocks, int32_t budget) {
  const auto& cfg = tiny().cfg;
  SchedulerOptions so;
  so.num_blocks = num_blocks;
  so.block_size = 4;
  so.max_num_batched_tokens = budget;
  so.max_num_seqs = 16;
  so.max_model_len = cfg.n_positions;
  so.vocab_size = cfg.vocab_size;
  so.watermark = 0.0;
  return so;
}

Request make_request(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens, float temperature = 0.0f) {
  Request r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.seed = 1000 + id;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> reference(const Request& r) {
  model::GenerateOptions opt;
  opt.max_tokens = r.max_tokens;
  opt.sampling = r.sampling;
  opt.sampling.seed = *r.seed;
  opt.ignore_eos = true;
  return model::generate(tiny().gpt, tiny().tok, r.prompt_ids, opt, model::GenerateMode::kKv).ids;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int len) {
  std::uniform_int_distribution<int32_t> id(0, 50000);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = id(rng);
  return p;
}

// Runs requests through an engine, submitting request i before step arrive[i],
// and returns each request's output ids.
std::map<uint64_t, std::vector<int32_t>> run(Engine& engine, const std::vector<Request>& reqs,
                                             const std::vector<int>& arrive) {
  std::map<uint64_t, std::vector<int32_t>> out;
  size_t next = 0;
  for (int step = 0; next < reqs.size() || engine.has_unfinished(); ++step) {
    while (next < reqs.size() && arrive[next] <= step) EXPECT_FALSE(engine.submit(reqs[next++]).has_value());
    engine.step();
    for (const auto& ev : engine.take_events())
      if (ev.finished) out[ev.request_id] = ev.output_ids;
    if (step > 10000) {
      ADD_FAILURE() << "engine did not finish";
      break;
    }
  }
  return out;
}

class EngineAttention : public ::testing::TestWithParam<model::PagedAttention> {};

TEST_P(EngineAttention, StaggeredChunkedRequestsMatchTheReferenceAlone) {
  std::mt19937 rng(5);
  std::vector<Request> reqs;
  std::vector<int> arrive;
  for (uint64_t i = 0; i < 8; ++i) {
    reqs.push_back(make_request(i, random_prompt(rng, 3 + static_cast<int>(i) * 7), 6 + static_cast<int>(i % 3) * 5));
    arrive.push_back(static_cast<int>(i) * 2);
  }
  auto so = small_options(256, 16);  // a 16-token budget forces chunked prefill
  model::PagedKvCache cache(tiny().cfg, so.num_blocks, so.block_size, torch::kCPU);
  Engine engine(tiny().gpt, cache, &tiny().tok, so, GetParam());
  auto out = run(engine, reqs, arrive);
  ASSERT_EQ(out.size(), reqs.size());
  for (const auto& r : reqs) EXPECT_EQ(out[r.id], reference(r)) << "request " << r.id;
  EXPECT_GT(engine.stats().steps, 10);
}

INSTANTIATE_TEST_SUITE_P(Paths, EngineAttention,
                         ::testing::Values(model::PagedAttention::kKernel, model::PagedAttention::kGather));

TEST(Engine, PreemptedRequestsStillMatchTheReference) {
  std::mt19937 rng(11);
  std::vector<Request> reqs;
  std::vector<int> arrive;
  for (uint64_t i = 0; i < 6; ++i) {
    reqs.push_back(make_request(i, random_prompt(rng, 10), 30));
    arrive.push_back(0);
  }
  // 6 sequences of up to 40 tokens need 60 blocks of 4; give them 24.
  auto so = small_options(24, 64);
  model::PagedKvCache cache(tiny().cfg, so.num_blocks, so.block_size, torch::kCPU);
  Engine engine(tiny().gpt, cache, &tiny().tok, so, model::PagedAttention::kAuto);
  auto out = run(engine, reqs, arrive);
  EXPECT_GT(engine.scheduler().stats().preemptions, 0) << "the pool was meant to run out";
  for (const auto& r : reqs) EXPECT_EQ(out[r.id], reference(r)) << "request " << r.id;
  EXPECT_EQ(engine.scheduler().allocator().num_used(), 0);
}

TEST(Engine, SeededSamplingIsTheSameAloneAndInABatch) {
  std::mt19937 rng(3);
  auto prompt = random_prompt(rng, 9);
  Request probe = make_request(42, prompt, 12, /*temperature=*/0.8f);
  probe.sampling.top_k = 40;
  std::vector<int32_t> alone;
  {
    auto so = small_options(64, 64);
    model::PagedKvCache cache(tiny().cfg, so.num_blocks, so.block_size, torch::kCPU);
    Engine engine(tiny().gpt, cache, &tiny().tok, so, model::PagedAttention::kAuto);
    alone = run(engine, {probe}, {0})[42];
  }
  std::vector<Request> crowd{probe};
  std::vector<int> arrive{1};
  for (uint64_t i = 0; i < 5; ++i) {
    crowd.push_back(make_request(i, random_prompt(rng, 5 + static_cast<int>(i)), 15, 1.0f));
    arrive.push_back(0);
  }
  auto so = small_options(128, 24);
  model::PagedKvCache cache(tiny().cfg, so.num_blocks, so.block_size, torch::kCPU);
  Engine engine(tiny().gpt, cache, &tiny().tok, so, model::PagedAttention::kAuto);
  auto out = run(engine, crowd, arrive);
  EXPECT_EQ(out[42], alone);
  EXPECT_EQ(alone.size(), 12u);
}

TEST(Engine, PrefixCacheHitsGiveTheSameTokens) {
  std::mt19937 rng(8);
  auto shared = random_prompt(rng, 21);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 4; ++i) {
    auto p = shared;
    auto own = random_prompt(rng, 3);
    p.insert(p.end(), own.begin(), own.end());
    reqs.push_back(make_request(i, p, 7));
  }
  auto so = small_options(128, 64);
  model::PagedKvCache cache(tiny().cfg, so.num_blocks, so.block_size, torch::kCPU);
  Engine engine(tiny().gpt, cache, &tiny().tok, so, model::PagedAttention::kAuto);
  auto out = run(engine, reqs, {0, 3, 4, 5});  // the first one fills the cache
  auto st = engine.scheduler().stats();
  EXPECT_GE(st.prefix_hit_tokens, 3 * 20) << "later requests reuse the 5 full shared blocks";
  for (const auto& r : reqs) EXPECT_EQ(out[r.id], reference(r)) << "request " << r.id;
}

TEST(Engine, RejectsAMismatchedCache) {
  auto so = small_options(64, 64);
  model::PagedKvCache cache(tiny().cfg, 32, so.block_size, torch::kCPU);
  EXPECT_THROW(Engine(tiny().gpt, cache, nullptr, so, model::PagedAttention::kAuto), std::invalid_argument);
}

TEST(Engine, ParsesMemorySizes) {
  EXPECT_EQ(parse_memory_size("2GiB"), 2LL << 30);
  EXPECT_EQ(parse_memory_size("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_memory_size("1.5G"), 3LL << 29);
  EXPECT_EQ(parse_memory_size("100000"), 100000);
  for (const char* bad : {"", "abc", "-1GiB", "0", "12XB", "nan"})
    EXPECT_THROW(parse_memory_size(bad), std::invalid_argument) << bad;
}

}  // namespace
}  // namespace troupe::actors
