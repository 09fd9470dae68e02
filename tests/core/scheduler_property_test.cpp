// Randomized property test of the scheduler: random submits, cancels (also
// while steps are in flight), one or two steps in flight, worker losses,
// failed steps and work items, and requests moved out and back in, over small
// pools that force preemption and eviction. After every operation
// check_invariants() holds and the harness checks each plan (budget, the
// worker's SequenceTable, block ownership, the shadow KV). At the end every
// accepted request finished exactly once, with the scripted tokens (no token
// lost or repeated, moves included), a count that fits its finish reason, and
// no block is left in use.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>

#include "core/scheduler.hpp"
#include "scheduler_harness.hpp"

namespace troupe::core {
namespace {

constexpr int32_t kEos = 50256;

struct Trial {
  SchedulerOptions options;
  std::map<uint64_t, Request> accepted;
  uint64_t digest = 0;  // of every plan, to check determinism
  int64_t preemptions = 0;
  int64_t hits = 0;
  int64_t moves = 0;
  std::set<uint64_t> moved;
  int64_t errors = 0;
  int64_t retries = 0;
};

void run_trial(uint64_t seed, int ops, Trial& t) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) {
    return static_cast<int>(std::uniform_int_distribution<int>(lo, hi)(rng));
  };

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
  o.max_steps_in_flight = pick(1, 2);
  const bool faults = pick(0, 2) == 0;

  test::Harness h(o);
  h.expect_worker_failures = faults;
  h.shadow.emplace(test::table_options(o));  // advance() must follow the worker's prepare() and commit()
  // Scripted tokens: a pure function of (id, position); eos now and then.
  h.script = [](uint64_t id, int32_t pos) {
    uint64_t x = test::mix(id, static_cast<uint64_t>(pos));
    return x % 13 == 0 ? kEos : static_cast<int32_t>(x % 5);
  };
  const std::vector<std::vector<int32_t>> prefixes = {
      {1, 2, 3, 4, 1, 2, 3, 4, 1, 2}, {4, 3, 2, 1, 0, 0, 1}, {}};

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
  auto fold = [&](const StepPlan& plan) {
    for (uint64_t id : plan.drop) t.digest = test::mix(t.digest, id);
    for (const auto& ns : plan.new_seqs) {
      t.digest = test::mix(t.digest, ns.seq_id ^ ns.sampling.seed);
      for (int32_t b : ns.block_table) t.digest = test::mix(t.digest, static_cast<uint64_t>(b));
    }
    for (const auto& w : plan.work) {
      t.digest = test::mix(t.digest, w.seq_id);
      t.digest =
          test::mix(t.digest, static_cast<uint64_t>(w.start_pos) << 20 | static_cast<uint64_t>(w.num_tokens));
      for (int32_t b : w.new_blocks) t.digest = test::mix(t.digest, static_cast<uint64_t>(b));
    }
  };
  auto plan_one = [&]() {
    if (!h.sched.can_schedule()) return;
    if (faults) {
      const int f = pick(0, 19);
      if (f == 0) h.fail_next_step = true;
      if (f == 1 && !t.accepted.empty()) {
        h.fail_seqs_next = {static_cast<uint64_t>(pick(1, static_cast<int>(next_id)))};
        h.fail_retryable = pick(0, 1) == 1;
      }
    }
    fold(h.plan_and_run());
  };
  auto move_one = [&]() {  // out of the scheduler (as to another worker) and back in
    const auto id = static_cast<uint64_t>(pick(1, static_cast<int>(next_id)));
    auto r = h.sched.extract(id);
    h.sched.check_invariants();
    if (r) {
      EXPECT_FALSE(h.resubmit(*r)) << "a moved request must be accepted again";
      ++t.moves;
      t.moved.insert(id);
    }
  };

  for (int op = 0; op < ops && !::testing::Test::HasFatalFailure(); ++op) {
    const int r = pick(0, 99);
    if (r < 25) {
      submit();
    } else if (r < 31) {
      cancel_some();
    } else if (r < 35) {
      move_one();
    } else if (r < 36) {
      h.results.clear();  // what was in flight died with the worker
      h.sched.on_worker_lost();
      h.sched.check_invariants();
      std::fill(h.kv.begin(), h.kv.end(), 0);  // a fresh worker
      h.worker = SequenceTable(test::table_options(o));
      h.shadow.emplace(test::table_options(o));
    } else if (r < 70) {
      plan_one();
    } else if (!h.results.empty()) {
      h.deliver();
    }
  }
  // Drain: everything accepted must finish.
  h.fail_next_step = false;
  h.fail_seqs_next.clear();
  for (int i = 0; i < 100000 && h.sched.has_unfinished() && !::testing::Test::HasFatalFailure(); ++i) {
    if (!h.results.empty() && (!h.sched.can_schedule() || pick(0, 1))) {
      h.deliver();
      continue;
    }
    auto plan = h.plan_and_run();
    fold(plan);
    if (plan.empty() && h.results.empty()) {
      ADD_FAILURE() << "seed " << seed << ": stuck with unfinished requests (blocks " << o.num_blocks << " x "
                    << o.block_size << ", budget " << o.max_num_batched_tokens << ", chunked "
                    << o.enable_chunked_prefill << ", watermark " << o.watermark << ", waiting "
                    << h.sched.num_waiting() << ", running " << h.sched.num_running() << ", free "
                    << h.sched.stats().blocks_free << ")";
      break;
    }
  }

  while (!h.results.empty()) h.deliver();
  const auto st = h.sched.stats();
  t.preemptions = st.preemptions;
  t.hits = st.prefix_hit_blocks;
  t.retries = st.retries;
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
    if (!t.moved.count(id)) {
      EXPECT_LE(f->usage.cached_tokens, prompt - 1) << who;
    }
    EXPECT_EQ(static_cast<int32_t>(h.token_events(id).size()), n) << who << ": one token event per token";
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
      case FinishReason::kError:
        EXPECT_TRUE(faults) << who << ": an error without injected faults";
        EXPECT_FALSE(f->error.empty()) << who;
        ++t.errors;
        break;
    }
  }
  EXPECT_EQ(st.tokens_generated, generated);
}

TEST(SchedulerProperty, RandomWorkloadsKeepEveryInvariant) {
  int64_t preemptions = 0, hits = 0, requests = 0, moves = 0, errors = 0, retries = 0;
  // TROUPE_PROPERTY_TRIALS=N runs a longer soak.
  const char* env = std::getenv("TROUPE_PROPERTY_TRIALS");
  const uint64_t trials = env != nullptr ? std::strtoull(env, nullptr, 10) : 300;
  for (uint64_t seed = 1; seed <= trials && !HasFatalFailure(); ++seed) {
    Trial t;
    run_trial(seed, 300, t);
    preemptions += t.preemptions;
    hits += t.hits;
    moves += t.moves;
    errors += t.errors;
    retries += t.retries;
    requests += static_cast<int64_t>(t.accepted.size());
  }
  // The workload must really exercise the hard paths.
  EXPECT_GT(preemptions, 100);
  EXPECT_GT(hits, 100);
  EXPECT_GT(requests, 10000);
  EXPECT_GT(moves, 100);
  EXPECT_GT(errors, 10);
  EXPECT_GT(retries, 10);
  std::printf(
      "[ property ] %lld requests, %lld preemptions, %lld prefix-cache block hits, %lld moves, "
      "%lld retries, %lld errors\n",
      static_cast<long long>(requests), static_cast<long long>(preemptions), static_cast<long long>(hits),
      static_cast<long long>(moves), static_cast<long long>(retries), static_cast<long long>(errors));
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
}  // namespace troupe::core
