// Randomized property test of the scheduler: random submits, cancels (also
// while a step is in flight), steps and worker losses over small pools that
// force preemption and eviction. After every operation check_invariants()
// holds and the harness checks each plan (budget, tokens, block tables, the
// shadow KV). At the end every accepted request finished exactly once, with
// the scripted tokens, a count that fits its finish reason, and no block is
// left in use.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "actors/scheduler.hpp"
#include "scheduler_harness.hpp"

namespace troupe::actors {
namespace {

constexpr int32_t kEos = 50256;

struct Trial {
  SchedulerOptions options;
  std::map<uint64_t, Request> accepted;
  uint64_t digest = 0;  // of every plan, to check determinism
  int64_t preemptions = 0;
  int64_t hits = 0;
};

void run_trial(uint64_t seed, int ops, Trial& t) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return static_cast<int>(std::uniform_int_distribution<int>(lo, hi)(rng)); };

  SchedulerOptions& o = t.options;
  const int sizes[] = {1, 2, 3, 4, 8};
  o.block_size = sizes[pick(0, 4)];
  o.num_blocks = pick(4, 40);
  o.max_num_batched_tokens = pick(1, 48);
  o.max_num_seqs = pick(1, 8);
  o.max_model_len = 64;
  o.enable_prefix_caching = pick(0, 3) != 0;
  o.enable_chunked_prefill = pick(0, 5) != 0;
  const double marks[] = {0.0, 0.0, 0.1, 0.3};
  o.watermark = marks[pick(0, 3)];
  o.seed = seed;

  test::Harness h(o);
  // Scripted tokens: a pure function of (id, position); eos now and then.
  h.script = [](uint64_t id, int32_t pos) {
    uint64_t x = test::mix(id, static_cast<uint64_t>(pos));
    return x % 13 == 0 ? kEos : static_cast<int32_t>(x % 5);
  };
  const std::vector<std::vector<int32_t>> prefixes = {{1, 2, 3, 4, 1, 2, 3, 4, 1, 2}, {4, 3, 2, 1, 0, 0, 1}, {}};

  uint64_t next_id = 1;
  auto submit = [&]() {
    Request r;
    r.id = next_id++;
    r.prompt_ids = prefixes[static_cast<size_t>(pick(0, 2))];
    const int tail = pick(r.prompt_ids.empty() ? 1 : 0, 20);
    for (int i = 0; i < tail; ++i) r.prompt_ids.push_back(pick(0, 4));
    r.max_tokens = pick(1, 20);
    r.priority = pick(0, 2);
    r.ignore_eos = pick(0, 4) == 0;
    if (pick(0, 1)) r.seed = rng();
    auto err = h.submit(r);
    if (!err) t.accepted.emplace(r.id, r);
  };
  auto cancel_some = [&]() { h.cancel(static_cast<uint64_t>(pick(1, static_cast<int>(next_id) + 2))); };
  auto fold = [&](const model::StepPlan& plan) {
    for (const auto& c : plan.seqs) {
      t.digest = test::mix(t.digest, c.seq_id);
      t.digest = test::mix(t.digest, static_cast<uint64_t>(c.start_pos) << 20 | c.token_ids.size());
      t.digest = test::mix(t.digest, c.sampling.seed);
      for (int32_t b : c.block_table) t.digest = test::mix(t.digest, static_cast<uint64_t>(b));
    }
  };

  for (int op = 0; op < ops && !::testing::Test::HasFatalFailure(); ++op) {
    const int r = pick(0, 99);
    if (r < 25) {
      submit();
    } else if (r < 33) {
      cancel_some();
    } else if (r < 40) {  // things happen while a step is in flight
      auto plan = h.begin_step();
      fold(plan);
      if (pick(0, 1)) cancel_some();
      if (pick(0, 1)) submit();
      if (!plan.seqs.empty()) h.end_step(plan);
    } else if (r < 41) {
      auto plan = h.begin_step();
      fold(plan);
      h.sched.on_worker_lost();
      h.sched.check_invariants();
      std::fill(h.kv.begin(), h.kv.end(), 0);  // a fresh worker
    } else {
      fold(h.step());
    }
  }
  // Drain: everything accepted must finish.
  for (int i = 0; i < 100000 && h.sched.has_unfinished() && !::testing::Test::HasFatalFailure(); ++i) {
    auto plan = h.step();
    fold(plan);
    if (plan.seqs.empty()) {
      ADD_FAILURE() << "seed " << seed << ": stuck with unfinished requests (blocks " << o.num_blocks << " x " << o.block_size << ", budget " << o.max_num_batched_tokens << ", chunked " << o.enable_chunked_prefill << ", watermark " << o.watermark << ", waiting " << h.sched.num_waiting() << ", running " << h.sched.num_running() << ", free " << h.sched.stats().blocks_free << ")";
      break;
    }
  }

  const auto st = h.sched.stats();
  t.preemptions = st.preemptions;
  t.hits = st.prefix_hit_blocks;
  EXPECT_EQ(st.blocks_used, 0) << "seed " << seed;
  EXPECT_EQ(st.blocks_free, o.num_blocks) << "seed " << seed;
  EXPECT_EQ(h.sched.allocator().num_cached(), h.sched.allocator().num_evictable()) << "seed " << seed;
  int64_t generated = 0;
  for (const auto& [id, req] : t.accepted) {
    const std::string who = "seed " + std::to_string(seed) + " request " + std::to_string(id);
    ASSERT_EQ(h.finals[id], 1) << who;
    const RequestEvent* f = h.final_event(id);
    ASSERT_NE(f, nullptr) << who;
    const auto& out = f->output_ids;
    const auto n = static_cast<int32_t>(out.size());
    const auto prompt = static_cast<int32_t>(req.prompt_ids.size());
    generated += n;
    EXPECT_EQ(f->usage.completion_tokens, n) << who;
    EXPECT_EQ(f->usage.prompt_tokens, prompt) << who;
    EXPECT_LE(f->usage.cached_tokens, prompt - 1) << who;
    EXPECT_EQ(static_cast<int32_t>(h.events[id].size()), n + 1) << who << ": one token event per token";
    for (int32_t k = 0; k < n; ++k) {
      ASSERT_EQ(out[static_cast<size_t>(k)], h.script(id, prompt + k)) << who << " token " << k;
      if (k + 1 < n && !req.ignore_eos) {
        ASSERT_NE(out[static_cast<size_t>(k)], kEos) << who << ": ran past eos";
      }
    }
    EXPECT_LE(n, req.max_tokens) << who;
    switch (f->finish_reason) {
      case FinishReason::kLength:
        EXPECT_EQ(n, req.max_tokens) << who;
        if (!req.ignore_eos) {
          EXPECT_NE(out.back(), kEos) << who;
        }
        break;
      case FinishReason::kEos:
        EXPECT_FALSE(req.ignore_eos) << who;
        EXPECT_EQ(out.back(), kEos) << who;
        break;
      case FinishReason::kCancelled:
        EXPECT_LT(n, req.max_tokens) << who;
        if (n > 0 && !req.ignore_eos) {
          EXPECT_NE(out.back(), kEos) << who;
        }
        break;
      case FinishReason::kStop:
        ADD_FAILURE() << who << ": stop without stop strings";
        break;
    }
  }
  EXPECT_EQ(st.tokens_generated, generated);
}

TEST(SchedulerProperty, RandomWorkloadsKeepEveryInvariant) {
  int64_t preemptions = 0, hits = 0, requests = 0;
  // TROUPE_PROPERTY_TRIALS=N runs a longer soak.
  const char* env = std::getenv("TROUPE_PROPERTY_TRIALS");
  const uint64_t trials = env != nullptr ? std::strtoull(env, nullptr, 10) : 300;
  for (uint64_t seed = 1; seed <= trials && !HasFatalFailure(); ++seed) {
    Trial t;
    run_trial(seed, 300, t);
    preemptions += t.preemptions;
    hits += t.hits;
    requests += static_cast<int64_t>(t.accepted.size());
  }
  // The workload must really exercise the hard paths.
  EXPECT_GT(preemptions, 100);
  EXPECT_GT(hits, 100);
  EXPECT_GT(requests, 10000);
  std::printf("[ property ] %lld requests, %lld preemptions, %lld prefix-cache block hits\n",
              static_cast<long long>(requests), static_cast<long long>(preemptions), static_cast<long long>(hits));
}

TEST(SchedulerProperty, SameInputsGiveSamePlans) {
  for (uint64_t seed : {3u, 17u, 99u}) {
    Trial a, b;
    run_trial(seed, 300, a);
    run_trial(seed, 300, b);
    EXPECT_EQ(a.digest, b.digest) << "seed " << seed;
    EXPECT_NE(a.digest, 0u);
  }
}

}  // namespace
}  // namespace troupe::actors
