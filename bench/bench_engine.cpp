// bench_engine: the paged engine's numbers, measured side by side in one run
// (GPT-2 124M shape, fp32, random weights: speed does not depend on values).
//  1. Output tokens/s vs concurrency (1, 4, 16, 32, 64 sequences at once).
//  2. KV utilisation on a mixed workload (prompts 16-512, outputs 16-256,
//     block 16) vs reserving contiguous max-length space per sequence.
//  3. Scheduler planning time with 256 running sequences vs the step's model time.
//  4. Prefix cache: 32 requests sharing a 256-token prefix, TTFT with and without.
//
//   build/bench_engine [--quick] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "common/machine_limits.hpp"
#include "core/scheduler.hpp"
#include "model/config.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/text/tokenizer.hpp"
#include "model/threading.hpp"
#include "model/weights.hpp"

using namespace troupe;
using Clock = std::chrono::steady_clock;

namespace {

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

core::SchedulerOptions options_for(const model::Gpt2Config& cfg, int32_t num_blocks) {
  core::SchedulerOptions so;
  so.num_blocks = num_blocks;
  so.block_size = 16;
  so.max_model_len = cfg.n_positions;
  so.vocab_size = cfg.vocab_size;
  so.eos_id = cfg.eos_token_id;
  return so;
}

core::Request make_request(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  core::Request r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> distinct_prompt(uint64_t id, int len) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((id * 7919 + i * 104729) % 50000));
  return p;
}

// 1. Throughput vs concurrency.
void bench_concurrency(const model::Gpt2& gpt, bool quick) {
  const auto& cfg = gpt.config();
  std::printf("1. output tokens/s vs concurrency (16-token prompts, %d new tokens each, greedy)\n",
              quick ? 16 : 64);
  std::printf("   %-12s %10s %12s %12s %10s %14s\n", "concurrent", "tokens", "seconds", "tokens/s", "vs 1",
              "peak RSS MiB");
  double base = 0;
  for (int n : {1, 4, 16, 32, 64}) {
    int new_tokens = quick ? 16 : 64;
    auto so = options_for(cfg, 1024);
    const bool peak_reset = bench::reset_peak_rss();
    model::PagedKvCache cache(cfg, so.num_blocks, so.block_size, gpt.device());
    actors::Engine engine(gpt, cache, nullptr, so, model::PagedAttention::kAuto);
    for (int i = 0; i < n; ++i) engine.submit(make_request(i, distinct_prompt(i, 16), new_tokens));
    auto t0 = Clock::now();
    engine.run_until_idle();
    double s = secs_since(t0);
    double tps = n * new_tokens / s;
    if (n == 1) base = tps;
    std::printf("   %-12d %10d %12.2f %12.1f %9.2fx %13.0f%s\n", n, n * new_tokens, s, tps, tps / base,
                bench::peak_rss_mib(), peak_reset ? "" : " (process peak: VmHWM could not be reset)");
  }
  std::printf(
      "   target: >= 8x tokens/s at 32 concurrent vs 1. Peak RSS (VmHWM, reset before each row):\n"
      "   the model's packed weights plus the KV blocks in use; the pool holds %.0f MiB but is not\n"
      "   touched until used.\n\n",
      static_cast<double>(model::PagedKvCache::bytes_per_block(cfg, 16)) * 1024 / (1 << 20));
}

// 2. KV utilisation, scheduler only with scripted tokens (no model needed:
// the allocation pattern does not depend on which tokens come out).
void bench_kv_utilisation() {
  model::Gpt2Config cfg = model::Gpt2Config::preset("gpt2");
  auto so = options_for(cfg, 2048);
  core::Scheduler sched(so);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> plen(16, 512), olen(16, 256);
  std::map<uint64_t, int32_t> reserve;  // id -> prompt + max_tokens
  for (uint64_t i = 0; i < 400; ++i) {
    int p = plen(rng), o = olen(rng);
    sched.submit(make_request(i, distinct_prompt(i, p), o));
    reserve[i] = p + o;
  }
  double util_sum = 0, contiguous_sum = 0, known_sum = 0;
  int64_t steps = 0;
  while (sched.has_unfinished()) {
    auto plan = sched.schedule();
    if (plan.empty()) break;
    auto st = sched.stats();
    int64_t reserved_max = static_cast<int64_t>(st.num_running) * cfg.n_positions;
    int64_t reserved_known = 0;
    for (const auto& w : plan.work) reserved_known += reserve[w.seq_id];
    util_sum += st.kv_utilization;
    contiguous_sum += reserved_max ? static_cast<double>(st.tokens_held) / reserved_max : 0;
    known_sum += reserved_known ? static_cast<double>(st.tokens_held) / reserved_known : 0;
    ++steps;
    core::StepResult res;
    res.step_id = plan.step_id;
    for (const auto& w : plan.work)
      if (w.sample) res.outputs.push_back({w.seq_id, core::SampledToken{1000, 0.0f, {}}});
    sched.on_step_done(res);
    sched.take_events();
  }
  std::printf(
      "2. KV utilisation, 400 requests, prompts 16-512, outputs 16-256, block 16, %d blocks (%lld steps)\n",
      so.num_blocks, static_cast<long long>(steps));
  std::printf("   paged (tokens held / slots allocated):              %6.2f%%   (target >= 95%%)\n",
              100.0 * util_sum / steps);
  std::printf("   contiguous, reserve max length (%d) per sequence:  %6.2f%%\n", cfg.n_positions,
              100.0 * contiguous_sum / steps);
  std::printf("   contiguous, reserve prompt + max_tokens:            %6.2f%%\n\n",
              100.0 * known_sum / steps);
}

// 3. Planning time vs model time with 256 running sequences.
void bench_planning(const model::Gpt2& gpt, bool quick) {
  const auto& cfg = gpt.config();
  int n = 256;
  auto so = options_for(cfg, 2048);
  so.max_num_seqs = n;
  so.max_num_batched_tokens = 4096;
  model::PagedKvCache cache(cfg, so.num_blocks, so.block_size, gpt.device());
  actors::Engine engine(gpt, cache, nullptr, so, model::PagedAttention::kAuto);
  for (int i = 0; i < n; ++i) engine.submit(make_request(i, distinct_prompt(i, 16), quick ? 3 : 6));
  engine.step();  // the prefill of all 256
  auto before = engine.stats();
  while (engine.has_unfinished()) engine.step();
  auto after = engine.stats();
  int64_t steps = after.steps - before.steps;
  double sched_ms = (after.schedule_ms - before.schedule_ms) / steps;
  double fwd_ms = (after.forward_ms - before.forward_ms) / steps;
  std::printf("3. scheduling with %d running sequences (decode steps: %lld)\n", n,
              static_cast<long long>(steps));
  std::printf(
      "   schedule + on_step_done: %.3f ms/step | model step: %.1f ms | ratio %.3f%%  (target < 1%%)\n\n",
      sched_ms, fwd_ms, 100.0 * sched_ms / fwd_ms);
}

// 4. Prefix cache: one request warms the cache, then 31 more sharing its
// 256-token prefix arrive together. Mean TTFT over the 31.
void bench_prefix_cache(const model::Gpt2& gpt) {
  const auto& cfg = gpt.config();
  std::vector<int32_t> prefix = distinct_prompt(999, 256);
  std::printf(
      "4. prefix cache: 32 requests sharing a 256-token prefix (+16 own tokens), 8 new tokens each\n");
  double ttft[2];
  for (int cached = 1; cached >= 0; --cached) {
    auto so = options_for(cfg, 1024);
    so.enable_prefix_caching = cached;
    model::PagedKvCache cache(cfg, so.num_blocks, so.block_size, gpt.device());
    actors::Engine engine(gpt, cache, nullptr, so, model::PagedAttention::kAuto);
    auto prompt = [&](int i) {
      auto p = prefix;
      auto own = distinct_prompt(i, 16);
      p.insert(p.end(), own.begin(), own.end());
      return p;
    };
    engine.submit(make_request(0, prompt(0), 8));
    engine.run_until_idle();
    engine.take_events();
    auto t0 = Clock::now();
    for (int i = 1; i < 32; ++i) engine.submit(make_request(i, prompt(i), 8));
    std::map<uint64_t, double> first;
    while (engine.has_unfinished()) {
      engine.step();
      for (const auto& ev : engine.take_events())
        if (ev.kind == core::EventKind::kToken && !first.count(ev.request_id)) first[ev.request_id] = secs_since(t0) * 1000;
    }
    double sum = 0;
    for (const auto& [id, ms] : first) sum += ms;
    ttft[cached] = sum / first.size();
    auto st = engine.scheduler().stats();
    std::printf("   caching %-3s: mean TTFT %8.1f ms | prompt tokens hit %lld/%lld\n", cached ? "on" : "off",
                ttft[cached], static_cast<long long>(st.prefix_hit_tokens),
                static_cast<long long>(st.prefix_query_tokens));
  }
  std::printf("   TTFT speed-up with caching: %.2fx\n\n", ttft[0] / ttft[1]);
}

}  // namespace

int main(int argc, char** argv) {
  model::init_numerics_process(argc, argv);
  bool quick = false;
  model::ThreadOptions threads;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads.intra_op_threads = std::atoi(argv[++i]);
  }
  model::configure_threads(threads);
  auto cfg = model::Gpt2Config::preset("gpt2");
  model::Gpt2 gpt(cfg, model::Gpt2Weights::random(cfg, 1), torch::kCPU);
  std::printf("bench_engine: GPT-2 124M shape, fp32, cpu\n%s\n\n", bench::machine_line().c_str());
  bench_concurrency(gpt, quick);
  bench_kv_utilisation();
  bench_planning(gpt, quick);
  bench_prefix_cache(gpt);
  return 0;
}
