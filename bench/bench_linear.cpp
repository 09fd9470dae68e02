// bench_linear: GPT-2 124M's linear layers through OpenBLAS (at::addmm, and
// at::addmv for one row, as the model called them before model/linear.cpp)
// and through Linear's packed AVX-512 kernel, side by side, per batch rows M.
//
// One pass = every weight matrix once, in model order (12 layers x c_attn
// [768, 2304], attn c_proj [768, 768], c_fc [768, 3072], mlp c_proj
// [3072, 768]; then the LM head x @ wte^T, wte [50257, 768]), each with its
// own weights, so no matrix is still in cache when its turn comes. Per M,
// the BLAS passes run first, then (after a pause that lets OpenBLAS's spinning
// workers sleep) the packed ones; best and median over the passes.
//
//   build/bench_linear [--threads N] [--reps N] [--m 1,4,64] [--shapes]
//   --shapes  also one line per matrix shape (ms summed over the 12 layers)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "model/linear.hpp"
#include "model/threading.hpp"

using namespace troupe::model;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  const char* name;
  int64_t in, out;
  WeightLayout layout;
  int count;  // matrices of this shape in the model
};

const Shape kShapes[] = {
    {"c_attn 768x2304", 768, 2304, WeightLayout::kInOut, 12},
    {"attn.c_proj 768x768", 768, 768, WeightLayout::kInOut, 12},
    {"c_fc 768x3072", 768, 3072, WeightLayout::kInOut, 12},
    {"mlp.c_proj 3072x768", 3072, 768, WeightLayout::kInOut, 12},
    {"lm_head 768x50257", 768, 50257, WeightLayout::kOutIn, 1},
};
constexpr int kShapeCount = 5;

struct Stats {
  double best = 0, median = 0;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2]};
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  ensure_passive_openmp(argc, argv);
  ThreadOptions threads;
  int reps = 0;
  bool per_shape = false;
  std::vector<int64_t> ms = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads.intra_op_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--shapes")) per_shape = true;
    else if (!std::strcmp(argv[i], "--blas-threads") && i + 1 < argc) threads.blas_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--m") && i + 1 < argc) {
      ms.clear();
      for (char* s = argv[++i]; *s;) {
        ms.push_back(std::strtoll(s, &s, 10));
        if (*s == ',') ++s;
      }
    } else {
      std::fprintf(stderr, "usage: bench_linear [--threads N] [--reps N] [--m 1,4,64] [--shapes]\n");
      return 2;
    }
  }
  configure_threads(threads);
  at::manual_seed(0);

  // Per shape: the BLAS-path Linears (weights as the model held them) and the packed ones.
  std::vector<Linear> blas[kShapeCount], packed[kShapeCount];
  std::vector<at::Tensor> bias[kShapeCount];
  bool any_packed = true;
  for (int s = 0; s < kShapeCount; ++s) {
    const Shape& sh = kShapes[s];
    for (int c = 0; c < sh.count; ++c) {
      at::Tensor w = sh.layout == WeightLayout::kInOut ? at::randn({sh.in, sh.out}) * 0.02
                                                        : at::randn({sh.out, sh.in}) * 0.02;
      blas[s].emplace_back(w, sh.layout, /*pack=*/false);
      packed[s].emplace_back(w, sh.layout, /*pack=*/true);
      any_packed = any_packed && packed[s].back().packed();
      bias[s].push_back(sh.layout == WeightLayout::kInOut ? at::randn({sh.out}) : at::Tensor());
    }
  }
  std::printf("bench_linear: GPT-2 124M linear layers, fp32, cpu, %s%s\n", thread_summary(),
              any_packed ? "" : "  (NO AVX-512 kernel in this build: both columns are OpenBLAS)");
#if !defined(_OPENMP)
  std::printf("NOTE: built without -fopenmp, so at::parallel_for (a header template) runs serially here:\n"
              "      the packed kernel uses one core while OpenBLAS uses its own threads.\n");
#endif
  std::printf("ms per pass over all 48 layer matrices + LM head; best (median) of the passes\n\n");
  std::printf("%5s | %18s %18s %6s | %18s %18s %6s | %8s %8s\n", "M", "layers blas", "layers packed", "x",
              "lm_head blas", "lm_head packed", "x", "GF/s bl", "GF/s pk");

  for (int64_t M : ms) {
    std::vector<at::Tensor> xs;
    for (const Shape& sh : kShapes) xs.push_back(at::randn({M, sh.in}));
    const int n = reps > 0 ? reps : (M <= 16 ? 30 : M <= 128 ? 10 : 4);
    // times[path][shape] per pass
    std::vector<double> times[2][kShapeCount];
    for (int path = 0; path < 2; ++path) {
      // OpenBLAS's idle workers spin for a while (~0.1 s) after a call and
      // would take the cores from the packed path's OpenMP threads.
      if (path == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      for (int r = 0; r < n + 1; ++r) {  // pass 0 warms up
        for (int s = 0; s < kShapeCount; ++s) {
          const auto& lin = path == 0 ? blas[s] : packed[s];
          const auto t0 = Clock::now();
          for (size_t c = 0; c < lin.size(); ++c) {
            at::Tensor y = lin[c].forward(xs[s], bias[s][c]);
            (void)y;
          }
          if (r > 0) times[path][s].push_back(ms_since(t0));
        }
      }
    }
    auto sum_layers = [&](int path) {
      std::vector<double> v(n, 0.0);
      for (int s = 0; s + 1 < kShapeCount; ++s)
        for (int r = 0; r < n; ++r) v[r] += times[path][s][r];
      return v;
    };
    const Stats lb = stats(sum_layers(0)), lp = stats(sum_layers(1));
    const Stats hb = stats(times[0][kShapeCount - 1]), hp = stats(times[1][kShapeCount - 1]);
    double flops = 0;
    for (const Shape& sh : kShapes) flops += 2.0 * M * sh.in * sh.out * sh.count;
    auto cell = [](const Stats& s) {
      static char buf[4][32];
      static int k = 0;
      char* b = buf[k++ % 4];
      std::snprintf(b, 32, "%8.2f (%7.2f)", s.best, s.median);
      return b;
    };
    std::printf("%5lld | %18s %18s %5.2fx | %18s %18s %5.2fx | %8.1f %8.1f\n", static_cast<long long>(M), cell(lb),
                cell(lp), lb.best / lp.best, cell(hb), cell(hp), hb.best / hp.best,
                flops / (lb.best + hb.best) * 1e-6, flops / (lp.best + hp.best) * 1e-6);
    if (per_shape)
      for (int s = 0; s < kShapeCount; ++s) {
        const Stats b = stats(times[0][s]), p = stats(times[1][s]);
        const double f = 2.0 * M * kShapes[s].in * kShapes[s].out * kShapes[s].count;
        std::printf("      %-22s blas %8.3f ms %7.1f GF/s   packed %8.3f ms %7.1f GF/s   %5.2fx\n", kShapes[s].name,
                    b.best, f / b.best * 1e-6, p.best, f / p.best * 1e-6, b.best / p.best);
      }
  }
  return 0;
}
