// bench_limits: GPT-2 124M's forward steps (random weights: speed does not
// depend on values) against the machine's physical limits, all measured in
// this one run, per kernel variant (cpu_features.hpp):
//  1. A batch-1 decode step (context 64) vs the memory floor: the bytes of
//     every weight a decode step reads, divided by the streaming read
//     bandwidth measured here. Target: step <= 1.1x floor. With --dtype
//     bfloat16 (int8, int8_g32) the model's matrices are bfloat16 (int8 with
//     a scale per output channel, or per group of 32 inputs) and the floor is
//     of their bytes. These steps run back to back ("warm": weights that fit
//     in the last-level cache may come from it); --floor times the step whose
//     weights come from memory ("cold") beside it.
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
// --dtypes float32,bfloat16 runs each storage as its own variant (weights
// and KV in that dtype, unless --kv-cache-dtype says otherwise) in the same
// rounds, and prints each step's time relative to the first dtype's: the
// ratios the 16-bit issue asks for, measured side by side.
//
// --floor measures figure 1 alone, pair by pair: a streaming read (512 MiB,
// or twice the last-level cache where that is larger), then 3 steps right
// after it, so both see the same moment of a machine whose bandwidth swings
// by a third between minutes (a VM's); it prints the median and quartiles of
// the pairs' ratios twice: for the first step ("cold": its weights come from
// memory) and for the best of the 3 ("warm": the steps after the first may
// find weights in the last-level cache; on a Xeon with a 260 MiB L3, int8's
// 124 MB of weights ran its best warm steps at 0.84-1.0x the floor, its
// cold ones at 1.36-1.38x).
//
//   build/bench_limits [--variants avx512,avx2] [--rounds N] [--threads N]
//                      [--dtypes float32,bfloat16] [--kv-cache-dtype auto|float32|bfloat16]
//                      [--floor | --teams | --profile decode1|decode1cold|prefill|decode64]
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
#include "core/serving_metrics.hpp"
#include "model/config.hpp"
#include "model/cpu_features.hpp"
#include "model/gpt2.hpp"
#include "model/kernel_team.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/threading.hpp"
#include "model/weights.hpp"

using namespace troupe;
using namespace troupe::model;
using troupe::bench::Clock;
using troupe::bench::ms_since;
using troupe::bench::ReadProbe;
using troupe::bench::Stats;
using troupe::bench::stats;

namespace {

// One kernel variant with one storage of weights and KV.
struct Variant {
  CpuIsa isa = CpuIsa::kPortable;
  WeightDtype dtype = WeightDtype::kFloat32;
  KvDtype kv = KvDtype::kFloat32;
  std::unique_ptr<Gpt2> model;
  std::unique_ptr<PagedKvCache> cache1, cache_p, cache64;
  double peak = 0;                                 // GFLOP/s: of the instruction its matrices run on
  // bfloat16 weights on avx512bf16 run on vdpbf16ps: their peak is that one's.
  bool bf16_dot() const {
    return isa == CpuIsa::kAvx512Bf16 && dtype == WeightDtype::kBFloat16 && troupe::model::bf16_dot();
  }
  std::vector<double> decode1, prefill, decode64;  // ms per round
  std::string name() const {
    const char* w = dtype == WeightDtype::kBFloat16 ? "bf16" : dtype == WeightDtype::kFloat32 ? "fp32" : to_string(dtype);
    return std::string(to_string(isa)) + "/" + w + "+kv" + (kv == KvDtype::kBFloat16 ? "16" : "32");
  }
  // The step's work with this variant's bytes: bfloat16 halves the
  // matrices' bytes (the fp32 vectors, ~0.1% of them, are counted at half
  // too) and the K/V's.
  bench::StepWork work(const Gpt2Config& cfg, int64_t S, int64_t rows, int64_t ctx) const {
    bench::StepWork w = bench::step_work(cfg, S, rows, ctx);
    if (dtype == WeightDtype::kBFloat16) w.weight_bytes /= 2;
    // int8 quarters them, plus an fp32 scale per output channel: 9 n_embd per
    // block (c_attn 3, c_proj 1, c_fc 4, mlp c_proj 1) and one per vocabulary row.
    if (dtype == WeightDtype::kInt8)
      w.weight_bytes = w.weight_bytes / 4 + 4.0 * (9.0 * cfg.n_embd * cfg.n_layer + cfg.vocab_size);
    // int8_g32: a byte a weight and an fp32 scale per 32 of them.
    if (dtype == WeightDtype::kInt8G32) w.weight_bytes = w.weight_bytes / 4 * (1 + 4.0 / 32);
    if (kv == KvDtype::kBFloat16) w.kv_bytes /= 2;
    return w;
  }
};

std::vector<WeightDtype> parse_dtypes(const std::string& list) {
  std::vector<WeightDtype> out;
  for (const std::string& name : bench::split_commas(list)) out.push_back(parse_weight_dtype(name));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  init_numerics_process(argc, argv);
  ThreadOptions threads;
  int rounds = 5;
  std::string profile;  // run one figure's step `rounds` times and nothing else (for perf record)
  bool teams = false;   // each step on OpenMP regions against kernel teams, alternating, and nothing else
  bool floor_pairs = false;  // the batch-1 step against the read of the same moment, pair by pair
  std::vector<WeightDtype> dtypes{WeightDtype::kFloat32};
  std::string kv_name = "auto";
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
    else if ((!std::strcmp(argv[i], "--dtype") || !std::strcmp(argv[i], "--dtypes")) && i + 1 < argc)
      dtypes = parse_dtypes(argv[++i]);
    else if (!std::strcmp(argv[i], "--kv-cache-dtype") && i + 1 < argc)
      kv_name = argv[++i];
    else if (!std::strcmp(argv[i], "--teams"))
      teams = true;
    else if (!std::strcmp(argv[i], "--floor"))
      floor_pairs = true;
    else {
      std::fprintf(
          stderr,
          "usage: bench_limits [--variants avx512,avx2] [--rounds N] [--threads N]\n"
          "                    [--dtypes float32,bfloat16,int8,int8_g32] [--kv-cache-dtype "
          "auto|float32|bfloat16]\n"
          "                    [--profile decode1|decode1cold|prefill|decode64]  (that step only, rounds "
          "times; decode1cold: each after a streaming read)\n"
          "                    [--teams]  (each step on OpenMP regions vs kernel teams, alternating)\n"
          "                    [--floor]  (the batch-1 step against the streaming read just before it)\n");
      return 2;
    }
  }
  configure_threads(threads);
  if (isas.empty()) isas = troupe::bench::vector_variants();

  const Gpt2Config cfg = Gpt2Config::preset("gpt2");
  const Gpt2Weights weights = Gpt2Weights::random(cfg, 1);
  std::printf("bench_limits: GPT-2 124M shape, random weights (fp32 math; storage per variant: weights+KV)\n%s\n",
              bench::machine_line().c_str());

  std::vector<Variant> vs;
  for (WeightDtype dtype : dtypes) {
    for (CpuIsa isa : isas) {
      ScopedKernelIsa scope(isa);
      Variant v;
      v.isa = isa;
      v.dtype = dtype;
      v.kv = parse_kv_cache_dtype(kv_name, dtype);
      v.model = std::make_unique<Gpt2>(cfg, weights, torch::kCPU, dtype);
      v.cache1 = bench::filled_cache(cfg, 4, 16, v.kv);
      v.cache_p = bench::filled_cache(cfg, 32, 16, v.kv);
      v.cache64 = bench::filled_cache(cfg, 64 * 8, 16, v.kv);
      vs.push_back(std::move(v));
    }
  }
  const FlatBatch decode1 = bench::step_batch(1, 1, 64), prefill = bench::step_batch(1, 512, 512),
                  decode64 = bench::step_batch(64, 1, 128);
  if (!profile.empty()) {
    const bool cold = profile == "decode1cold";
    const bool p = profile == "prefill", d1 = profile == "decode1" || cold;
    Variant& v = vs.front();
    ScopedKernelIsa scope(v.isa);
    // decode1cold: each step after a streaming read of twice the last-level cache, as --floor's first.
    std::unique_ptr<ReadProbe> evict;
    if (cold)
      evict =
          std::make_unique<ReadProbe>(std::max(size_t{512} << 20, 2 * bench::last_level_cache_bytes()), 0);
    for (int r = 0; r < rounds; ++r) {
      if (evict) {
        const double gbs = evict->gbs(1);
        std::printf("read %.1f GB/s, ", gbs);
      }
      const auto t0 = Clock::now();
      v.model->forward_step(p ? prefill : d1 ? decode1 : decode64, p ? *v.cache_p : d1 ? *v.cache1 : *v.cache64);
      std::printf("%s %s: %.1f ms (kernel team helpers moved off their caller's CPU: %llu so far)\n",
                  profile.c_str(), v.name().c_str(), ms_since(t0),
                  static_cast<unsigned long long>(model::kernel_team_moves()));
    }
    return 0;
  }
  if (teams) {
    // Blocks of steps, the two ways alternating block by block
    // (model/kernel_team.hpp): per variant and step the median of each way
    // and their ratio, from the same minutes of the machine.
    struct TeamStep {
      const char* name;
      const FlatBatch* batch;
      int per_block;
    };
    const FlatBatch decode8 = bench::step_batch(8, 1, 128);  // in the 64-sequence cache
    const FlatBatch decode32 = bench::step_batch(32, 1, 128);
    const TeamStep steps[] = {{"decode 1", &decode1, 20},
                              {"decode 8", &decode8, 10},
                              {"decode 32", &decode32, 6},
                              {"decode 64", &decode64, 4},
                              {"prefill 512", &prefill, 1}};
    std::printf("%d rounds per step, OpenMP regions and kernel teams alternating by blocks of steps\n",
                rounds * 4);
    for (auto& v : vs) {
      ScopedKernelIsa scope(v.isa);
      for (const TeamStep& st : steps) {
        PagedKvCache& cache = st.batch == &decode1   ? *v.cache1
                              : st.batch == &prefill ? *v.cache_p
                                                     : *v.cache64;
        std::vector<double> ms[2];
        for (int r = -1; r < rounds * 4; ++r) {
          for (int team = 0; team < 2; ++team) {
            set_kernel_team_enabled(team == 1);
            for (int k = 0; k < st.per_block; ++k) {
              const auto t0 = Clock::now();
              v.model->forward_step(*st.batch, cache);
              if (r >= 0) ms[team].push_back(ms_since(t0));
            }
          }
        }
        set_kernel_team_enabled(true);
        const Stats o = stats(ms[0]), t = stats(ms[1]);
        std::printf(
            "%-22s %-11s OpenMP %8.3f ms (best %8.3f) | teams %8.3f ms (best %8.3f) | OpenMP / teams: "
            "median %.3fx, best %.3fx\n",
            v.name().c_str(), st.name, o.median, o.best, t.median, t.best, o.median / t.median,
            o.best / t.best);
      }
    }
    return 0;
  }
  if (floor_pairs) {
    // The batch-1 step against its memory floor pair by pair: each pair is
    // a streaming read (best of 2 passes over a buffer kept for the run) and,
    // right after it, 3 steps, so both halves see the same moment of a
    // machine whose bandwidth swings between minutes. The read spans twice
    // the last-level cache at least, so the first step finds its weights in
    // memory ("cold"); the next two may find some of them still in that
    // cache from the step before ("warm", the best of the 3: a weight set
    // smaller than the cache, as int8's 124 MB under the Xeon's 260 MiB L3,
    // can beat the floor there). Each figure is the median of the pairs'
    // ratios, with their quartiles.
    const size_t llc = bench::last_level_cache_bytes();
    const size_t read_bytes = std::max(size_t{512} << 20, 2 * llc);
    ReadProbe probe(read_bytes, 0);
    const int pairs = rounds * 10;
    std::printf(
        "%d pairs per variant: streaming read (best of 2 passes, %zu MiB; last-level cache %zu MiB), then 3 "
        "batch-1 steps (ctx 64): the first (cold) and the best of all 3 (warm); variants alternating pair by "
        "pair\n\n",
        pairs, read_bytes >> 20, llc >> 20);
    std::vector<std::vector<double>> ratio(vs.size()), step(vs.size()), floors(vs.size()), cold(vs.size());
    for (int r = -1; r < pairs; ++r) {
      for (size_t i = 0; i < vs.size(); ++i) {
        Variant& v = vs[i];
        ScopedKernelIsa scope(v.isa);
        const double gbs = probe.gbs(2);
        {  // wake the step's kernel team (asleep through the read): the cold step pays memory, not a futex
           // wake
          const model::KernelTeamScope wake(1);
          model::kernel_parallel_for(0, 2, 1, [](int64_t, int64_t) {});
        }
        double best = 1e30, first = 0;
        for (int k = 0; k < 3; ++k) {
          const auto t0 = Clock::now();
          v.model->forward_step(decode1, *v.cache1);
          const double ms = ms_since(t0);
          if (k == 0) first = ms;
          best = std::min(best, ms);
        }
        if (r < 0) continue;
        const double floor_ms = v.work(cfg, 1, 1, 64).weight_bytes / (gbs * 1e9) * 1e3;
        cold[i].push_back(first / floor_ms);
        ratio[i].push_back(best / floor_ms);
        step[i].push_back(best);
        floors[i].push_back(floor_ms);
      }
    }
    std::printf("%-18s | %-30s | %-30s | %-14s | %-14s | %s\n", "variant",
                "cold step / floor: median (p25-p75)", "warm step / floor: median (p25-p75)", "warm median",
                "floor median", "best warm / best floor");
    for (size_t i = 0; i < vs.size(); ++i) {
      const Stats s = stats(step[i]), f = stats(floors[i]);
      std::printf(
          "%-18s | %6.3fx (%5.3f-%5.3f)%16s | %6.3fx (%5.3f-%5.3f)%16s | %8.3f ms    | %8.3f ms    | %.3f / "
          "%.3f = %.3fx\n",
          vs[i].name().c_str(), core::percentile(cold[i], 50), core::percentile(cold[i], 25),
          core::percentile(cold[i], 75), "", core::percentile(ratio[i], 50), core::percentile(ratio[i], 25),
          core::percentile(ratio[i], 75), "", s.median, f.median, s.best, f.best, s.best / f.best);
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
      v.peak = std::max(v.peak, bench::fma_peak_gflops(v.isa, 0, v.bf16_dot()));
      ScopedKernelIsa scope(v.isa);
      double best1 = 1e30;
      for (int k = 0; k < 5; ++k) {
        const auto t0 = Clock::now();
        v.model->forward_step(decode1, *v.cache1);
        best1 = std::min(best1, ms_since(t0));
      }
      auto t0 = Clock::now();
      v.model->forward_step(prefill, *v.cache_p);
      const double p_ms = ms_since(t0);
      t0 = Clock::now();
      v.model->forward_step(decode64, *v.cache64);
      const double d64_ms = ms_since(t0);
      if (r < 0) continue;
      v.decode1.push_back(best1);
      v.prefill.push_back(p_ms);
      v.decode64.push_back(d64_ms);
    }
  }
  std::printf("streaming read (best of the rounds): %.1f GB/s\n", read_gbs);
  for (const auto& v : vs)
    if (v.dtype == dtypes.front() || v.bf16_dot())
      std::printf("%s peak (best of the rounds), %s instructions, %d threads: %.1f GFLOP/s\n",
                  v.bf16_dot() ? "vdpbf16ps" : "FMA", to_string(v.isa), at::get_num_threads(), v.peak);
  std::printf("\n%d rounds, variants alternating; best (median) per figure\n\n", rounds);
  std::printf("%-16s | %-42s | %-34s | %-34s\n", "variant", "decode batch 1, ctx 64, warm (--floor: cold)",
              "prefill 512 tokens (>= 65% peak)", "decode 64 seqs, ctx 128 (>= 65%)");
  for (const auto& v : vs) {
    const bench::StepWork wp = v.work(cfg, 1, 512, 512), wd = v.work(cfg, 64, 1, 128);
    const double floor_ms = wd.weight_bytes / (read_gbs * 1e9) * 1e3;
    const Stats d = stats(v.decode1), p = stats(v.prefill), d64 = stats(v.decode64);
    const double fp = wp.flops(), fd = wd.flops();
    std::printf(
        "%-16s | %6.2f (%6.2f) ms = %4.2fx floor %5.2f ms | %7.1f (%7.1f) ms %6.1f GF/s %3.0f%% | %6.1f (%6.1f) ms "
        "%6.1f GF/s %3.0f%%\n",
        v.name().c_str(), d.best, d.median, d.best / floor_ms, floor_ms, p.best, p.median, fp / p.best * 1e-6,
        100.0 * fp / p.best * 1e-6 / v.peak, d64.best, d64.median, fd / d64.best * 1e-6,
        100.0 * fd / d64.best * 1e-6 / v.peak);
  }
  const bench::StepWork wp0 = bench::step_work(cfg, 1, 512, 512), wd0 = bench::step_work(cfg, 64, 1, 128);
  std::printf("\nprefill: %.1f GFLOP per step; decode 64: %.1f GFLOP per step (multiply-add = 2)\n",
              wp0.flops() * 1e-9, wd0.flops() * 1e-9);
  if (dtypes.size() > 1) {
    // Each variant's medians against the first dtype's with the same ISA.
    std::printf("\nspeed-up over %s (median over median, same instructions, same rounds):\n",
                to_string(dtypes.front()));
    for (const auto& v : vs) {
      if (v.dtype == dtypes.front()) continue;
      for (const auto& b : vs) {
        if (b.isa != v.isa || b.dtype != dtypes.front()) continue;
        std::printf("  %-16s decode 1: %.2fx | prefill 512: %.2fx | decode 64: %.2fx\n", v.name().c_str(),
                    stats(b.decode1).median / stats(v.decode1).median,
                    stats(b.prefill).median / stats(v.prefill).median,
                    stats(b.decode64).median / stats(v.decode64).median);
      }
    }
  }
  // How much of the peak a step can reach at all on this machine: the FLOPs
  // over the least time step_bound_ms allows (the attention of 64 sequences
  // reads its K/V at the read bandwidth, after and before matrix products).
  std::printf(
      "\nceiling at these limits (attention not overlapped with the matrix products; K/V read once):\n");
  for (const auto& v : vs) {
    const bench::StepWork wp = v.work(cfg, 1, 512, 512), wd = v.work(cfg, 64, 1, 128);
    const double bp = bench::step_bound_ms(wp, v.peak, read_gbs), bd = bench::step_bound_ms(wd, v.peak, read_gbs);
    std::printf(
        "  %-16s prefill 512 >= %.1f ms (at most %.0f%% of peak; best step %.2fx that) | "
        "decode 64 (%.0f MB weights, %.0f MB K/V) >= %.1f ms (at most %.0f%%; best step %.2fx)\n",
        v.name().c_str(), bp, 100.0 * wp.flops() / bp * 1e-6 / v.peak, stats(v.prefill).best / bp,
        wd.weight_bytes * 1e-6, wd.kv_bytes * 1e-6, bd, 100.0 * wd.flops() / bd * 1e-6 / v.peak,
        stats(v.decode64).best / bd);
  }
  return 0;
}
