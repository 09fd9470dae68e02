// The engine end to end on a tiny random GPT-2: many requests sharing steps
// (continuous batching, chunked prefill, preemption, prefix caching) must each
// produce exactly what the contiguous-KV reference loop gives them alone.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>
#include <set>

#include "actors/engine.hpp"
#include "model/generate.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/step_executor.hpp"
#include "model/weights.hpp"
#include "test_utils.hpp"

namespace troupe::actors {
namespace {

using core::Request;
using core::SchedulerOptions;

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
      if (ev.finished()) out[ev.request_id] = ev.output_ids;
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
    reqs.push_back(
        make_request(i, random_prompt(rng, 3 + static_cast<int>(i) * 7), 6 + static_cast<int>(i % 3) * 5));
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

// Presence and frequency penalties and logit biases, through batching and
// preemption (a preempted sequence comes back with its generated tokens,
// which the penalties must keep counting): each request's tokens are those
// the reference loop gives it alone.
TEST(Engine, LogitAdjustmentsSurviveBatchingAndPreemption) {
  std::mt19937 rng(17);
  std::vector<Request> reqs;
  std::vector<int> arrive;
  for (uint64_t i = 0; i < 6; ++i) {
    Request r = make_request(i, random_prompt(rng, 8), 30, i % 2 ? 0.9f : 0.0f);
    r.sampling.presence_penalty = i % 3 == 0 ? 2.0f : 0.0f;
    r.sampling.frequency_penalty = i % 3 == 1 ? 1.0f : 0.0f;
    r.sampling.repetition_penalty = i == 2 || i == 3 ? 1.8f : 1.0f;
    // The tiny model's rows are nearly flat: a sampled sequence seldom repeats
    // a token (nothing to penalise) unless a bias makes one likely.
    if (i % 3 == 2 || i % 2 == 1) r.sampling.logit_bias = {{11, 8.0f}, {13, -100.0f}};
    reqs.push_back(r);
    arrive.push_back(static_cast<int>(i));
  }
  // A prompt that ends with what greedy decoding goes on to repeat: the
  // repetition penalty must count the prompt's tokens too.
  Request echo = make_request(6, random_prompt(rng, 4), 12);
  const std::vector<int32_t> continued = reference(echo);
  echo.prompt_ids.insert(echo.prompt_ids.end(), continued.begin(), continued.begin() + 8);
  echo.sampling.repetition_penalty = 1.8f;
  reqs.push_back(echo);
  arrive.push_back(2);
  auto so = small_options(22, 64);
  model::PagedKvCache cache(tiny().cfg, so.num_blocks, so.block_size, torch::kCPU);
  Engine engine(tiny().gpt, cache, &tiny().tok, so, model::PagedAttention::kAuto);
  auto out = run(engine, reqs, arrive);
  EXPECT_GT(engine.scheduler().stats().preemptions, 0) << "the pool was meant to run out";
  int moved = 0;
  for (const auto& r : reqs) {
    EXPECT_EQ(out[r.id], reference(r)) << "request " << r.id;
    Request plain = r;
    plain.sampling.presence_penalty = plain.sampling.frequency_penalty = 0.0f;
    plain.sampling.repetition_penalty = 1.0f;
    plain.sampling.logit_bias.clear();
    const bool changed = out[r.id] != reference(plain);
    moved += changed;
    EXPECT_TRUE(changed) << "request " << r.id;
  }
  EXPECT_EQ(moved, 7) << "every request's adjustments were meant to change its tokens";
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

TEST(Engine, RefusesOptionsThatDoNotFitTheModelOrCache) {
  const auto& cfg = tiny().cfg;
  auto so = small_options(64, 64);
  model::PagedKvCache cache(cfg, so.num_blocks, so.block_size, torch::kCPU);
  auto refused = [&](SchedulerOptions o, model::PagedKvCache& c, const std::string& words) {
    try {
      Engine e(tiny().gpt, c, nullptr, o, model::PagedAttention::kAuto);
      ADD_FAILURE() << "accepted options that should fail with: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  model::PagedKvCache small(cfg, 32, so.block_size, torch::kCPU);
  refused(so, small, "KV cache 32 of 4");
  auto o = so;
  o.max_model_len = cfg.n_positions + 1;
  refused(o, cache, "n_positions");
  o = so;
  o.vocab_size = cfg.vocab_size - 1;
  o.eos_id = -1;
  refused(o, cache, "vocab_size");
  o = so;
  o.block_size = 8;
  refused(o, cache, "blocks of 8");
  EXPECT_NO_THROW(Engine(tiny().gpt, cache, nullptr, so, model::PagedAttention::kAuto));
}

// An executor that fails chosen steps the way a worker can: the real one
// underneath, with a throw on a chosen step (out of memory, say) or NaN
// logits for one sequence.
struct FaultyWorker {
  explicit FaultyWorker(const SchedulerOptions& so)
      : cache(tiny().cfg, so.num_blocks, so.block_size, torch::kCPU), exec(tiny().gpt, cache) {}
  core::StepResult operator()(const core::StepPlan& plan) {
    ++steps;
    if (throw_on.count(steps))
      throw std::runtime_error("injected: out of memory on step " + std::to_string(steps));
    core::StepResult r = exec.execute(plan);
    if (poison && !r.outputs.empty()) {  // the worker's row of `poison` came out NaN
      for (size_t i = 0; i < r.outputs.size(); ++i) {
        if (r.outputs[i].seq_id != *poison) continue;
        r.failures.push_back({*poison, "seq " + std::to_string(*poison) + ": logits contain NaN", false});
        r.outputs.erase(r.outputs.begin() + static_cast<ptrdiff_t>(i));
        break;
      }
    }
    return r;
  }
  model::PagedKvCache cache;
  model::StepExecutor exec;
  int steps = 0;
  std::set<int> throw_on;
  std::optional<uint64_t> poison;
};

TEST(Engine, AStepThatThrowsIsRetriedAndTheEngineGoesOn) {
  std::mt19937 rng(21);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 4; ++i) reqs.push_back(make_request(i, random_prompt(rng, 6), 8));
  auto so = small_options(128, 64);
  auto worker = std::make_shared<FaultyWorker>(so);
  worker->throw_on = {3};
  Engine engine(so, &tiny().tok, [worker](const core::StepPlan& p) { return (*worker)(p); });
  auto out = run(engine, reqs, {0, 0, 0, 0});
  EXPECT_EQ(engine.scheduler().stats().failed_steps, 1);
  EXPECT_GE(engine.scheduler().stats().retries, 1);
  for (const auto& r : reqs) EXPECT_EQ(out[r.id], reference(r)) << "request " << r.id;
}

TEST(Engine, ARequestThatKeepsFailingEndsWithAnErrorAndOnlyIt) {
  std::mt19937 rng(22);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 3; ++i) reqs.push_back(make_request(i, random_prompt(rng, 5), 6));
  auto so = small_options(128, 64);
  auto worker = std::make_shared<FaultyWorker>(so);
  worker->poison = 1;
  Engine engine(so, &tiny().tok, [worker](const core::StepPlan& p) { return (*worker)(p); });
  for (const auto& r : reqs) ASSERT_FALSE(engine.submit(r));
  std::map<uint64_t, core::RequestEvent> finals;
  while (engine.has_unfinished()) {
    ASSERT_TRUE(engine.step());
    for (auto& ev : engine.take_events())
      if (ev.finished()) finals[ev.request_id] = ev;
  }
  ASSERT_EQ(finals.size(), 3u);
  EXPECT_EQ(finals[1].finish_reason, core::FinishReason::kError);
  EXPECT_NE(finals[1].error.find("NaN"), std::string::npos) << finals[1].error;
  for (uint64_t id : {0, 2}) {
    EXPECT_EQ(finals[id].finish_reason, core::FinishReason::kLength) << id;
    EXPECT_EQ(finals[id].output_ids, reference(reqs[id])) << id;
  }
  EXPECT_EQ(engine.scheduler().allocator().num_used(), 0);
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
