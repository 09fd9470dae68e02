// bench_generate: the seed's point, measured side by side in one run.
//  1. naive (recompute everything, O(N^2)) vs kv (contiguous cache, O(N))
//     tokens/s for 16-token prompts generating 32, 128 and 256 tokens.
//  2. The kv decode step next to its floor: one plain matrix-vector product
//     over every weight matrix of the model (what a decode step cannot beat
//     on this machine: it must read every weight once).
// GPT-2 124M shape, fp32, random weights (speed does not depend on values).
//
//   build/bench_generate [--quick] [--threads N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/machine_limits.hpp"
#include "model/config.hpp"
#include "model/generate.hpp"
#include "model/gpt2.hpp"
#include "model/text/tokenizer.hpp"
#include "model/threading.hpp"
#include "model/weights.hpp"

using namespace troupe::model;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// One plain matrix-vector product per weight matrix (the LM head is wte
// [vocab, E]), one pass over all of them as a decode step makes, so no matrix
// is still in cache when its turn comes. A GEMV reads a row-major [in, out]
// matrix as BLAS's "N" case and its [out, in] copy as the "T" case; OpenBLAS
// is not equally fast at both, so a pass is timed in each layout and the
// faster counts: the floor is the best plain GEMV pass this machine does.
double floor_ms(const Gpt2Weights& w, int reps) {
  std::vector<at::Tensor> in_out, out_in, xs;
  for (const auto& l : w.layers)
    for (const auto* t :
         {&l.attn_c_attn_weight, &l.attn_c_proj_weight, &l.mlp_c_fc_weight, &l.mlp_c_proj_weight})
      in_out.push_back(t->contiguous());
  in_out.push_back(w.wte.t().contiguous());
  for (const auto& m : in_out) {
    out_in.push_back(m.t().contiguous());
    xs.push_back(at::randn({m.size(0)}));
  }
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < in_out.size(); ++i) at::mv(in_out[i].t(), xs[i]);
    best = std::min(best, ms_since(t0));
    t0 = Clock::now();
    for (size_t i = 0; i < out_in.size(); ++i) at::mv(out_in[i], xs[i]);
    best = std::min(best, ms_since(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  init_numerics_process(argc, argv);
  bool quick = false;
  ThreadOptions threads;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads.intra_op_threads = std::atoi(argv[++i]);
  }
  configure_threads(threads);
  at::manual_seed(0);

  auto cfg = Gpt2Config::preset("gpt2");
  auto weights = Gpt2Weights::random(cfg, 1);
  Gpt2 model(cfg, weights, torch::kCPU);
  auto tok = Tokenizer::from_dir(TROUPE_TOKENIZER_DIR);
  std::printf("bench_generate: GPT-2 124M shape, fp32, cpu\n%s\n\n", troupe::bench::machine_line().c_str());

  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) prompt.push_back(1000 + 37 * i);

  std::printf("%-8s %8s %14s %14s %10s\n", "new tok", "mode", "total ms", "tokens/s", "kv/naive");
  std::vector<int> lens = quick ? std::vector<int>{32} : std::vector<int>{32, 128, 256};
  for (int n : lens) {
    GenerateOptions opt;
    opt.max_tokens = n;
    opt.sampling.temperature = 0.0f;
    opt.ignore_eos = true;
    double tps[2];
    int k = 0;
    for (auto mode : {GenerateMode::kNaive, GenerateMode::kKv}) {
      auto t0 = Clock::now();
      auto r = generate(model, tok, prompt, opt, mode);
      double ms = ms_since(t0);
      tps[k] = r.ids.size() * 1000.0 / ms;
      std::printf("%-8d %8s %14.1f %14.1f %10s\n", n, k == 0 ? "naive" : "kv", ms, tps[k],
                  k == 0 ? "" : (std::to_string(tps[1] / tps[0]).substr(0, 5) + "x").c_str());
      ++k;
    }
  }

  // Decode step vs floor, interleaved so both see the same machine state.
  auto cache = model.make_contiguous_cache(cfg.n_positions);
  model.forward_contiguous(prompt, cache);
  int reps = quick ? 10 : 40;
  double step_best = 1e30, step_sum = 0;
  double floor_best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    model.forward_contiguous({1234}, cache);
    double ms = ms_since(t0);
    step_best = std::min(step_best, ms);
    step_sum += ms;
    floor_best = std::min(floor_best, floor_ms(weights, 2));
  }
  std::printf("\nkv decode step (context %d..%d): best %.2f ms, mean %.2f ms\n", 16, 16 + reps, step_best,
              step_sum / reps);
  std::printf("floor (one matrix-vector product per weight matrix): best %.2f ms\n", floor_best);
  std::printf("decode ms / floor ms = %.2f  (target <= 1.3)\n", step_best / floor_best);
  return 0;
}
