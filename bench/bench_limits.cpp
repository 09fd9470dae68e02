// bench_limits: GPT-2 124M's forward steps (random weights: speed does not
// depend on values) against the machine's physical limits, all measured in
// this one run, per kernel variant (cpu_features.hpp):
//  1. A batch-1 decode step (context 64) vs the memory floor: the bytes of
//     every weight a decode step reads, divided by the streaming read
//     bandwidth measured here. Target: step <= 1.1x floor. With --dtype
//     bfloat16 (int8) the model's matrices are bfloat16 (int8 with a scale per
//     output channel) and the floor is of their bytes.
//  2. The prefill of one 512-token prompt and a decode step of 64 sequences
//     (context 128 each), in GFLOP/s as a share of the variant's FMA peak
//     (independent register FMAs on every thread, that variant's ISA).
//     Target: >= 65%. Beside them, the most of the peak each step can reach
//     at this bandwidth and peak (step_bound_ms: attention's K/V reads do not
//     overlap the matrix products), and how far the step is from it.
// Every figure goes through Gpt2::forward_step, the engine's path (paged KV,
// the CPU attention kernel, logits only for the rows that sample). Variants
// alternate round by round, each with its own Gpt2 packed for it; best and
// median over the rounds.
//
//   build/bench_limits [--variants avx512,avx2] [--rounds N] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "common/bench_util.hpp"
#include "common/machine_limits.hpp"
#include "common/step_batches.hpp"
#include "model/config.hpp"
#include "model/cpu_features.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/threading.hpp"
#include "model/weights.hpp"

using namespace troupe;
using namespace troupe::model;
using troupe::bench::Clock;
using troupe::bench::ms_since;
using troupe::bench::Stats;
using troupe::bench::stats;

namespace {

struct Variant {
  CpuIsa isa = CpuIsa::kPortable;
  std::unique_ptr<Gpt2> model;
  double peak = 0;                                 // GFLOP/s
  std::vector<double> decode1, prefill, decode64;  // ms per round
};

}  // namespace

int main(int argc, char** argv) {
  init_numerics_process(argc, argv);
  ThreadOptions threads;
  int rounds = 5;
  std::string profile;  // run one figure's step `rounds` times and nothing else (for perf record)
  WeightDtype dtype = WeightDtype::kFloat32;
  std::vector<CpuIsa> isas;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads.intra_op_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc)
      rounds = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--variants") && i + 1 < argc)
      isas = troupe::bench::parse_variants(argv[++i]);
    else if (!std::strcmp(argv[i], "--profile") && i + 1 < argc)
      profile = argv[++i];
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc)
      dtype = parse_weight_dtype(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: bench_limits [--variants avx512,avx2] [--rounds N] [--threads N] [--dtype float32|bfloat16|int8|int8_g32]\n"
                   "                    [--profile decode1|prefill|decode64]  (that step only, rounds times)\n");
      return 2;
    }
  }
  configure_threads(threads);
  if (isas.empty()) isas = troupe::bench::vector_variants();

  const Gpt2Config cfg = Gpt2Config::preset("gpt2");
  const Gpt2Weights weights = Gpt2Weights::random(cfg, 1);
  std::printf("bench_limits: GPT-2 124M shape, %s weights (fp32 math), random\n%s\n", to_string(dtype),
              bench::machine_line().c_str());

  std::vector<Variant> vs;
  for (CpuIsa isa : isas) {
    ScopedKernelIsa scope(isa);
    Variant v;
    v.isa = isa;
    v.model = std::make_unique<Gpt2>(cfg, weights, torch::kCPU, dtype);
    vs.push_back(std::move(v));
  }
  const FlatBatch decode1 = bench::step_batch(1, 1, 64), prefill = bench::step_batch(1, 512, 512),
                  decode64 = bench::step_batch(64, 1, 128);
  auto cache1 = bench::filled_cache(cfg, 4), cache_p = bench::filled_cache(cfg, 32),
       cache64 = bench::filled_cache(cfg, 64 * 8);
  if (!profile.empty()) {
    const bool p = profile == "prefill", d1 = profile == "decode1";
    ScopedKernelIsa scope(vs.front().isa);
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = Clock::now();
      vs.front().model->forward_step(p ? prefill : d1 ? decode1 : decode64, p ? *cache_p : d1 ? *cache1 : *cache64);
      std::printf("%s %s: %.1f ms\n", profile.c_str(), to_string(vs.front().isa), ms_since(t0));
    }
    return 0;
  }
  // The limits are measured again every round, between the figures, and
  // the best of the rounds counts: on a shared machine a limit taken once
  // may catch a busy moment the figures do not (or the other way round).
  double read_gbs = 0;
  for (int r = -1; r < rounds; ++r) {  // round -1 warms up
    read_gbs = std::max(read_gbs, bench::read_bandwidth_gbs(size_t{512} << 20, 0, 2));
    for (auto& v : vs) {
      v.peak = std::max(v.peak, bench::fma_peak_gflops(v.isa));
      ScopedKernelIsa scope(v.isa);
      double best1 = 1e30;
      for (int k = 0; k < 5; ++k) {
        const auto t0 = Clock::now();
        v.model->forward_step(decode1, *cache1);
        best1 = std::min(best1, ms_since(t0));
      }
      auto t0 = Clock::now();
      v.model->forward_step(prefill, *cache_p);
      const double p_ms = ms_since(t0);
      t0 = Clock::now();
      v.model->forward_step(decode64, *cache64);
      const double d64_ms = ms_since(t0);
      if (r < 0) continue;
      v.decode1.push_back(best1);
      v.prefill.push_back(p_ms);
      v.decode64.push_back(d64_ms);
    }
  }
  bench::StepWork wp = bench::step_work(cfg, 1, 512, 512), wd = bench::step_work(cfg, 64, 1, 128);
  // bfloat16 halves the matrices' bytes; the fp32 vectors (norms, biases:
  // ~0.1% of them) are counted at half too.
  if (dtype == WeightDtype::kBFloat16) {
    wp.weight_bytes /= 2;
    wd.weight_bytes /= 2;
  }
  // int8 quarters them, plus an fp32 scale per output channel: 9 n_embd per
  // block (c_attn 3, c_proj 1, c_fc 4, mlp c_proj 1) and one per vocabulary row.
  if (dtype == WeightDtype::kInt8) {
    const double scale_bytes = 4.0 * (9.0 * cfg.n_embd * cfg.n_layer + cfg.vocab_size);
    wp.weight_bytes = wp.weight_bytes / 4 + scale_bytes;
    wd.weight_bytes = wd.weight_bytes / 4 + scale_bytes;
  }
  // int8_g32: a byte a weight and an fp32 scale per 32 of them.
  if (dtype == WeightDtype::kInt8G32) {
    wp.weight_bytes = wp.weight_bytes / 4 * (1 + 4.0 / 32);
    wd.weight_bytes = wd.weight_bytes / 4 * (1 + 4.0 / 32);
  }
  const double weight_bytes = wd.weight_bytes;
  const double floor_ms = weight_bytes / (read_gbs * 1e9) * 1e3;
  std::printf(
      "streaming read (best of the rounds): %.1f GB/s; weights %.1f MB -> memory floor %.2f ms per "
      "decode step\n",
      read_gbs, weight_bytes * 1e-6, floor_ms);
  for (const auto& v : vs)
    std::printf("FMA peak (best of the rounds), %s instructions, %d threads: %.1f GFLOP/s\n", to_string(v.isa),
                at::get_num_threads(), v.peak);
  const double fp = wp.flops(), fd = wd.flops();
  std::printf("\n%d rounds, variants alternating; best (median) per figure\n\n", rounds);
  std::printf("%-8s | %-32s | %-34s | %-34s\n", "variant", "decode batch 1, ctx 64 (<= 1.1x)",
              "prefill 512 tokens (>= 65% peak)", "decode 64 seqs, ctx 128 (>= 65%)");
  for (const auto& v : vs) {
    const Stats d = stats(v.decode1), p = stats(v.prefill), d64 = stats(v.decode64);
    std::printf(
        "%-8s | %6.2f (%6.2f) ms = %4.2fx floor | %7.1f (%7.1f) ms %6.1f GF/s %3.0f%% | %6.1f (%6.1f) ms "
        "%6.1f GF/s %3.0f%%\n",
        to_string(v.isa), d.best, d.median, d.best / floor_ms, p.best, p.median, fp / p.best * 1e-6,
        100.0 * fp / p.best * 1e-6 / v.peak, d64.best, d64.median, fd / d64.best * 1e-6,
        100.0 * fd / d64.best * 1e-6 / v.peak);
  }
  std::printf("\nprefill: %.1f GFLOP per step; decode 64: %.1f GFLOP per step (multiply-add = 2)\n",
              fp * 1e-9, fd * 1e-9);
  // How much of the peak a step can reach at all on this machine: the FLOPs
  // over the least time step_bound_ms allows (the attention of 64 sequences
  // reads its K/V at the read bandwidth, after and before matrix products).
  std::printf(
      "\nceiling at these limits (attention not overlapped with the matrix products; K/V read once):\n");
  std::printf(
      "  prefill 512: %.1f MB of weights, %.1f MB of K/V; decode 64: %.1f MB of weights, %.1f MB of K/V\n",
      wp.weight_bytes * 1e-6, wp.kv_bytes * 1e-6, wd.weight_bytes * 1e-6, wd.kv_bytes * 1e-6);
  for (const auto& v : vs) {
    const double bp = bench::step_bound_ms(wp, v.peak, read_gbs),
                 bd = bench::step_bound_ms(wd, v.peak, read_gbs);
    std::printf(
        "  %-8s prefill 512 >= %.1f ms (at most %.0f%% of peak; best step %.2fx that) | "
        "decode 64 >= %.1f ms (at most %.0f%%; best step %.2fx)\n",
        to_string(v.isa), bp, 100.0 * fp / bp * 1e-6 / v.peak, stats(v.prefill).best / bp, bd,
        100.0 * fd / bd * 1e-6 / v.peak, stats(v.decode64).best / bd);
  }
  return 0;
}
