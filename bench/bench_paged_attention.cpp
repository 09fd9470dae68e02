// bench_paged_attention: measured side by side in one run (fp32, random data;
// speed does not depend on values).
//  1. A decode step's paged attention (1 query per sequence), GPT-2's 12
//     heads x 64, block 16: the in-place CPU kernel vs the portable gather
//     path, at batch 16 x context 512 for one layer, and at batch 64 x
//     context 128 for 12 layers (a whole step's K/V, beside the streaming
//     read bandwidth).
//  2. Gpt2::forward_step decode steps on GPT-2 124M (context 128) at batch 1,
//     16 and 64 against a floor: one plain matrix-vector product over every
//     weight matrix (4 per block and the tied LM head), i.e. what a decode
//     step must at least stream from memory. Skipped with --attention-only.
//
//   build-*/bench_paged_attention [--attention-only] [--iters N]
// Threads: TROUPE_THREADS if set, else 2 (torch intra-op and OpenBLAS).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/machine_limits.hpp"
#include "model/config.hpp"
#include "model/gpt2.hpp"
#include "model/paged_attention.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/threading.hpp"
#include "model/weights.hpp"

using namespace troupe::model;
using Clock = std::chrono::steady_clock;

namespace {

struct Timing {
  double best = 0, median = 0;  // ms
};

// Runs every fn in turn, `iters` rounds after 2 warm-up rounds. Alternating
// means a burst of load elsewhere on the machine hits all of them alike; the
// best time is the least disturbed one.
std::vector<Timing> alternate(int iters, const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> ms(fns.size());
  for (int it = -2; it < iters; ++it) {
    for (size_t r = 0; r < fns.size(); ++r) {
      const auto t0 = Clock::now();
      fns[r]();
      if (it >= 0) ms[r].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  }
  std::vector<Timing> out;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    out.push_back({v.front(), v[v.size() / 2]});
  }
  return out;
}

// Shuffled blocks for `batch` sequences of `ctx` tokens each.
torch::Tensor block_tables(int64_t batch, int64_t ctx, int64_t bs, int64_t num_blocks, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t per = (ctx + bs - 1) / bs;
  torch::Tensor t = torch::empty({batch, per}, torch::kInt);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t b = 0; b < per; ++b) t[s][b] = ids[static_cast<size_t>(s * per + b)];
  return t;
}

// One decode step's paged attention for B sequences at context ctx, over
// `layers` pools of their own (as a forward step reads them one after the
// other: with 12 layers a 64 x 128 step's K/V is 604 MB, far beyond the
// caches), in place and through the gather path; the kernel's K/V read rate
// beside the streaming read bandwidth measured in this run.
void bench_attention(int iters, int64_t B, int64_t ctx, int64_t layers) {
  const int64_t H = 12, D = 64, bs = 16;
  const int64_t nb = B * ((ctx + bs - 1) / bs) + 8;
  std::mt19937 rng(1);
  std::vector<PagedAttentionInput> in(static_cast<size_t>(layers));
  for (auto& l : in) {
    l.q = torch::randn({B, H, D});
    l.k_pool = torch::randn({nb, H, bs, D});
    l.v_pool = torch::randn({nb, H, bs, D});
    l.block_tables = block_tables(B, ctx, bs, nb, rng);
    for (int64_t s = 0; s <= B; ++s) l.query_start.push_back(s);
    l.context_lens.assign(static_cast<size_t>(B), ctx);
  }
  const double diff =
      (paged_attention_cpu(in.front()) - paged_attention_gather(in.front())).abs().max().item<double>();
  const auto t = alternate(iters, {[&] {
                                     for (const auto& l : in) paged_attention_cpu(l);
                                   },
                                   [&] {
                                     for (const auto& l : in) paged_attention_gather(l);
                                   }});
  const double read_gbs = troupe::bench::read_bandwidth_gbs(size_t{512} << 20, 0, 3);
  const double bytes = 2.0 * static_cast<double>(layers * B * ctx * H * D) * sizeof(float);
  std::printf(
      "paged attention, decode step: batch %lld, context %lld, %lld layers of %lld heads x %lld, block "
      "%lld\n",
      (long long)B, (long long)ctx, (long long)layers, (long long)H, (long long)D, (long long)bs);
  std::printf("  best / median of %d alternating runs; K/V read: %.0f MB a step\n", iters, bytes * 1e-6);
  std::printf(
      "  kernel (in place)  %8.3f / %8.3f ms  %5.1f GB/s at best = %.2fx the streaming read (%.1f GB/s)\n",
      t[0].best, t[0].median, bytes / t[0].best * 1e-6, bytes / t[0].best * 1e-6 / read_gbs, read_gbs);
  std::printf("  gather (torch ops) %8.3f / %8.3f ms\n", t[1].best, t[1].median);
  std::printf("  speed-up           %8.2fx / %7.2fx   (max |kernel - gather| = %.2e)\n\n",
              t[1].best / t[0].best, t[1].median / t[0].median, diff);
}

// A decode step of `B` sequences, each at position `ctx` with blocks shuffled.
FlatBatch decode_batch(const Gpt2Config& cfg, int64_t B, int64_t ctx, int64_t bs, int64_t num_blocks) {
  std::mt19937 rng(static_cast<uint32_t>(B));
  FlatBatch batch;
  batch.block_tables = block_tables(B, ctx + 1, bs, num_blocks, rng);
  std::vector<int64_t> ids, pos, slots;
  batch.query_start = {0};
  for (int64_t s = 0; s < B; ++s) {
    ids.push_back(static_cast<int64_t>(rng() % static_cast<uint32_t>(cfg.vocab_size)));
    pos.push_back(ctx);
    slots.push_back(batch.block_tables[s][ctx / bs].item<int32_t>() * bs + ctx % bs);
    batch.query_start.push_back(s + 1);
    batch.context_lens.push_back(ctx + 1);
    batch.sample_rows.push_back(s);
  }
  batch.token_ids = torch::tensor(ids, torch::kLong);
  batch.positions = torch::tensor(pos, torch::kLong);
  batch.slot_mapping = torch::tensor(slots, torch::kLong);
  return batch;
}

void bench_decode(int iters) {
  const Gpt2Config cfg = Gpt2Config::preset("gpt2");
  const Gpt2Weights w = Gpt2Weights::random(cfg, 1);
  const Gpt2 model(cfg, w, torch::kCPU);

  // Floor: y = W x for every weight matrix, W in the GEMV-friendly [out, in] layout.
  std::vector<torch::Tensor> mats;
  for (const auto& l : w.layers)
    for (const auto* m :
         {&l.attn_c_attn_weight, &l.attn_c_proj_weight, &l.mlp_c_fc_weight, &l.mlp_c_proj_weight})
      mats.push_back(m->t().contiguous());
  mats.push_back(w.wte);
  int64_t floats = 0;
  for (const auto& m : mats) floats += m.numel();
  std::vector<torch::Tensor> xs;
  for (const auto& m : mats) xs.push_back(torch::randn({m.size(1)}));

  const int64_t ctx = 128, bs = 16;
  const std::vector<int64_t> batches{1, 16, 64};
  std::vector<PagedKvCache> caches;
  std::vector<FlatBatch> steps;
  for (int64_t B : batches) {
    caches.emplace_back(cfg, B * (ctx / bs + 1) + 4, bs);
    steps.push_back(decode_batch(cfg, B, ctx, bs, caches.back().num_blocks()));
  }
  ContiguousKv kv = model.make_contiguous_cache(ctx + 8);
  std::vector<int32_t> prompt(static_cast<size_t>(ctx));
  for (int64_t i = 0; i < ctx; ++i)
    prompt[static_cast<size_t>(i)] = static_cast<int32_t>(i * 17 % cfg.vocab_size);
  model.forward_contiguous(prompt, kv);

  std::vector<std::function<void()>> runs;
  runs.push_back([&] {
    for (size_t i = 0; i < mats.size(); ++i) at::mv(mats[i], xs[i]);
  });
  for (size_t b = 0; b < batches.size(); ++b)
    runs.push_back([&, b] { model.forward_step(steps[b], caches[b]); });
  runs.push_back([&] {
    kv.length = ctx;
    model.forward_contiguous({42}, kv);
  });
  const std::vector<Timing> t = alternate(iters, runs);
  std::vector<double> best, med;
  for (const Timing& x : t) {
    best.push_back(x.best);
    med.push_back(x.median);
  }
  std::printf("\nGPT-2 124M decode step (context 128, block 16), best / median of %d alternating runs\n",
              iters);
  std::printf(
      "  floor: one matvec over every weight matrix (%.0f MB)  %7.2f / %7.2f ms  (%.1f GB/s at best)\n",
      floats * 4e-6, best[0], med[0], floats * 4e-6 / best[0]);
  for (size_t b = 0; b < batches.size(); ++b) {
    const double B = static_cast<double>(batches[b]);
    std::printf(
        "  forward_step batch %3lld  %7.2f / %7.2f ms/step  %7.3f ms/token  %.2fx floor/step  %.1fx batch "
        "1/token\n",
        (long long)batches[b], best[b + 1], med[b + 1], best[b + 1] / B, best[b + 1] / best[0],
        best[1] / (best[b + 1] / B));
  }
  const size_t c = runs.size() - 1;
  std::printf("  forward_contiguous 1 token  %7.2f / %7.2f ms  %.2fx floor\n", best[c], med[c],
              best[c] / best[0]);
}

}  // namespace

int main(int argc, char** argv) {
  init_numerics_process(argc, argv);
  bool attention_only = false;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--attention-only"))
      attention_only = true;
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--attention-only] [--iters N]\n", argv[0]);
      return 2;
    }
  }
  ThreadOptions threads;
  const char* env = std::getenv("TROUPE_THREADS");
  threads.intra_op_threads = env && *env ? 0 : 2;
  configure_threads(threads);
  std::printf("%s\n\n", troupe::bench::machine_line().c_str());
  bench_attention(iters, 16, 512, 1);
  bench_attention(iters, 64, 128, 12);  // the K/V of bench_limits' 64-sequence decode step
  if (!attention_only) bench_decode(iters);
  return 0;
}
