// bench_sampler: sampling next to the forward step it follows, per kernel
// variant (cpu_features.hpp), measured side by side in one run.
//  1. One 50257-id row, per parameter set: near-uniform logits (a random
//     model's: nothing can be pruned, the hard case) and peaked ones (a
//     trained model's shape, Zipf-like).
//  2. 64 rows through sample_rows (its threads) per parameter set, as a
//     share of a 64-sequence decode step (Gpt2::forward_step, context 128)
//     of the same variant; the rows are that step's logits. Target: <= 5%.
// Variants alternate round by round; best and median over the rounds.
//
//   build/bench_sampler [--variants avx512,avx2,portable] [--rounds N] [--threads N] [--profile S]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/bench_util.hpp"
#include "common/machine_limits.hpp"
#include "common/step_batches.hpp"
#include "model/config.hpp"
#include "model/cpu_features.hpp"
#include "model/gpt2.hpp"
#include "model/sampler.hpp"
#include "model/threading.hpp"
#include "model/weights.hpp"

using namespace troupe;
using namespace troupe::model;
using troupe::bench::Clock;
using troupe::bench::ms_since;
using troupe::bench::Stats;
using troupe::bench::stats;

namespace {

SamplingParams params(float temperature, int32_t top_k, float top_p, int32_t logprobs = -1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = 1234;
  p.logprobs = logprobs;
  return p;
}

struct Setting {
  const char* name;
  SamplingParams params;
};

const Setting kSettings[] = {
    {"greedy", params(0.0f, 0, 1.0f)},
    {"T 1", params(1.0f, 0, 1.0f)},
    {"T 1 top-p 0.9", params(1.0f, 0, 0.9f)},
    {"T 0.7 top-k 50", params(0.7f, 50, 1.0f)},
    {"T 0.8 k 50 p 0.95 lp 5", params(0.8f, 50, 0.95f, 5)},
    {"T 1 top-p 0.9 lp 20", params(1.0f, 0, 0.9f, 20)},
    {"T 1 top-p 0.5", params(1.0f, 0, 0.5f)},
    {"T 1 top-p 0.2", params(1.0f, 0, 0.2f)},
};
constexpr int kNumSettings = static_cast<int>(sizeof(kSettings) / sizeof(kSettings[0]));

struct Variant {
  CpuIsa isa = CpuIsa::kPortable;
  std::unique_ptr<Gpt2> model;
  std::vector<double> step;                                       // ms per round
  std::vector<std::vector<double>> row_flat, row_peaked, rows64;  // [setting][round]: us, us, ms
};

}  // namespace

int main(int argc, char** argv) {
  init_numerics_process(argc, argv);
  ThreadOptions threads;
  int rounds = 5;
  int profile = -1;  // a setting's index: sample the 64 flat rows `rounds` x 100 times and nothing else
  std::vector<CpuIsa> isas;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads.intra_op_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc)
      rounds = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--variants") && i + 1 < argc)
      isas = troupe::bench::parse_variants(argv[++i]);
    else if (!std::strcmp(argv[i], "--profile") && i + 1 < argc)
      profile = std::atoi(argv[++i]);
    else {
      std::fprintf(
          stderr,
          "usage: bench_sampler [--variants avx512,avx2,portable] [--rounds N] [--threads N]\n"
          "                     [--profile S]  (setting S, 0-based, on this thread only: for perf)\n");
      return 2;
    }
  }
  configure_threads(threads);
  if (isas.empty()) isas = troupe::bench::vector_variants();

  const Gpt2Config cfg = Gpt2Config::preset("gpt2");
  const Gpt2Weights weights = Gpt2Weights::random(cfg, 1);
  std::printf(
      "bench_sampler: 50257-id rows; decode step of GPT-2 124M shape, 64 sequences, context 128\n%s\n\n",
      bench::machine_line().c_str());
  std::vector<Variant> vs;
  for (CpuIsa isa : isas) {
    ScopedKernelIsa scope(isa);
    Variant v;
    v.isa = isa;
    v.model = std::make_unique<Gpt2>(cfg, weights, torch::kCPU);
    v.row_flat.resize(kNumSettings);
    v.row_peaked.resize(kNumSettings);
    v.rows64.resize(kNumSettings);
    vs.push_back(std::move(v));
  }
  const FlatBatch batch = bench::step_batch(64, 1, 128);
  auto cache = bench::filled_cache(cfg, 64 * 8);
  // The rows a random model gives (near-uniform), and peaked rows: Zipf
  // logits (rank r gets -1.1 log r, scaled), ranks shuffled over the ids.
  at::Tensor flat = vs.front().model->forward_step(batch, *cache).contiguous();
  at::Tensor peaked = at::empty_like(flat);
  for (int64_t r = 0; r < 64; ++r) {
    const at::Tensor rank = at::randperm(cfg.vocab_size, at::kLong).to(at::kFloat) + 1;
    peaked[r] = rank.log() * -3.3f;
  }
  const int64_t V = cfg.vocab_size;
  std::vector<int64_t> positions(64, 128);
  if (profile >= 0 && profile < kNumSettings) {
    ScopedKernelIsa scope(vs.front().isa);
    const auto t0 = Clock::now();
    for (int i = 0; i < rounds * 100; ++i)
      sample(flat.data_ptr<float>() + (i % 64) * V, V, kSettings[profile].params, 128);
    std::printf("%s, %s: %.1f us per row\n", kSettings[profile].name, to_string(vs.front().isa),
                ms_since(t0) * 1e3 / (rounds * 100));
    return 0;
  }

  for (int r = -1; r < rounds; ++r) {  // round -1 warms up
    for (auto& v : vs) {
      ScopedKernelIsa scope(v.isa);
      auto t0 = Clock::now();
      v.model->forward_step(batch, *cache);
      const double step_ms = ms_since(t0);
      if (r >= 0) v.step.push_back(step_ms);
      for (int s = 0; s < kNumSettings; ++s) {
        const SamplingParams& p = kSettings[s].params;
        // One row at a time on this thread: the mean over 16 rows.
        t0 = Clock::now();
        for (int64_t i = 0; i < 16; ++i) sample(flat.data_ptr<float>() + i * V, V, p, 128);
        const double flat_us = ms_since(t0) * 1e3 / 16;
        t0 = Clock::now();
        for (int64_t i = 0; i < 16; ++i) sample(peaked.data_ptr<float>() + i * V, V, p, 128);
        const double peaked_us = ms_since(t0) * 1e3 / 16;
        t0 = Clock::now();
        sample_rows(flat, std::vector<SamplingParams>(64, p), positions);
        const double rows_ms = ms_since(t0);
        if (r < 0) continue;
        v.row_flat[s].push_back(flat_us);
        v.row_peaked[s].push_back(peaked_us);
        v.rows64[s].push_back(rows_ms);
      }
    }
  }
  std::printf("%d rounds, variants alternating; best (median)\n", rounds);
  for (const auto& v : vs) {
    const Stats st = stats(v.step);
    std::printf("\n%s: decode step, 64 sequences: %.1f (%.1f) ms\n", to_string(v.isa), st.best, st.median);
    std::printf("  %-24s | %-19s | %-19s | %-19s | %s\n", "parameters", "1 row, random model",
                "1 row, peaked", "64 rows (threads)", "64 rows / step (<= 5%)");
    for (int s = 0; s < kNumSettings; ++s) {
      const Stats f = stats(v.row_flat[s]), p = stats(v.row_peaked[s]), b = stats(v.rows64[s]);
      std::printf("  %-24s | %7.1f (%7.1f) us | %7.1f (%7.1f) us | %7.2f (%7.2f) ms | %5.2f%%\n",
                  kSettings[s].name, f.best, f.median, p.best, p.median, b.best, b.median,
                  100.0 * b.best / st.best);
    }
  }
  return 0;
}
