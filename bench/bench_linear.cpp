// bench_linear: GPT-2 124M's linear layers through OpenBLAS (at::addmm, and
// at::addmv for one row, as the model called them before model/linear.cpp)
// and through Linear's packed kernel in every variant this CPU runs (AVX-512
// 6x64, AVX2 6x16), side by side, per batch rows M, with each variant's FMA
// peak measured in the same run (bench/common/machine_limits.hpp): before
// every M's packed passes, the best of the run counting; the table comes at
// the end.
//
// One pass = every weight matrix once, in model order (12 layers x c_attn
// [768, 2304], attn c_proj [768, 768], c_fc [768, 3072], mlp c_proj
// [3072, 768]; then the LM head x @ wte^T, wte [50257, 768]), each with its
// own weights, so no matrix is still in cache when its turn comes. Per M, the
// BLAS passes run first, then (after a pause that lets OpenBLAS's spinning
// workers sleep) the packed variants, alternating pass by pass; best and
// median over the passes.
//
//   build/bench_linear [--threads N] [--reps N] [--m 1,4,64] [--shapes] [--variants avx2,avx512]
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
#include <ATen/Parallel.h>

#include "common/bench_util.hpp"
#include "common/machine_limits.hpp"
#include "model/cpu_features.hpp"
#include "model/linear.hpp"
#include "model/threading.hpp"

using namespace troupe::model;
using troupe::bench::Clock;
using troupe::bench::ms_since;
using troupe::bench::Stats;
using troupe::bench::stats;

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

}  // namespace

int main(int argc, char** argv) {
  init_numerics_process(argc, argv);
  ThreadOptions threads;
  int reps = 0;
  bool per_shape = false;
  std::vector<int64_t> ms = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  std::vector<CpuIsa> isas;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads.intra_op_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--shapes"))
      per_shape = true;
    else if (!std::strcmp(argv[i], "--blas-threads") && i + 1 < argc)
      threads.blas_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--m") && i + 1 < argc) {
      ms.clear();
      for (char* s = argv[++i]; *s;) {
        ms.push_back(std::strtoll(s, &s, 10));
        if (*s == ',') ++s;
      }
    } else if (!std::strcmp(argv[i], "--variants") && i + 1 < argc) {
      isas = troupe::bench::parse_variants(argv[++i]);
    } else {
      std::fprintf(
          stderr,
          "usage: bench_linear [--threads N] [--reps N] [--m 1,4,64] [--shapes] [--variants avx2,avx512]\n");
      return 2;
    }
  }
  configure_threads(threads);
  at::manual_seed(0);
  if (isas.empty()) isas = troupe::bench::vector_variants();
  if (std::count(isas.begin(), isas.end(), CpuIsa::kPortable)) {
    std::fprintf(stderr, "bench_linear: the portable variant is the OpenBLAS column already\n");
    return 2;
  }
  // paths: 0 = BLAS, then one per packed variant.
  const int n_paths = 1 + static_cast<int>(isas.size());
  std::vector<std::vector<Linear>> lins(static_cast<size_t>(n_paths * kShapeCount));
  auto lin = [&](int path, int s) -> std::vector<Linear>& {
    return lins[static_cast<size_t>(path * kShapeCount + s)];
  };
  std::vector<at::Tensor> bias[kShapeCount];
  for (int s = 0; s < kShapeCount; ++s) {
    const Shape& sh = kShapes[s];
    for (int c = 0; c < sh.count; ++c) {
      at::Tensor w = sh.layout == WeightLayout::kInOut ? at::randn({sh.in, sh.out}) * 0.02
                                                       : at::randn({sh.out, sh.in}) * 0.02;
      lin(0, s).emplace_back(w, sh.layout, /*pack=*/false);
      for (int v = 0; v < static_cast<int>(isas.size()); ++v)
        lin(1 + v, s).emplace_back(w, sh.layout, isas[v]);
      bias[s].push_back(sh.layout == WeightLayout::kInOut ? at::randn({sh.out}) : at::Tensor());
    }
  }
  std::printf("bench_linear: GPT-2 124M linear layers, fp32, cpu\n%s\n",
              troupe::bench::machine_line().c_str());
#if !defined(_OPENMP)
  std::printf(
      "NOTE: built without -fopenmp, so at::parallel_for (a header template) runs serially here:\n"
      "      the packed kernel uses one core while OpenBLAS uses its own threads.\n");
#endif
  // Each variant's FMA peak is measured again before every M's packed
  // passes and the best of the run counts (a peak taken once may catch a
  // busy moment and make every share look too high), so the table is
  // printed at the end.
  std::vector<double> peak(isas.size(), 0.0);
  auto measure_peaks = [&] {
    for (size_t i = 0; i < isas.size(); ++i)
      peak[i] = std::max(peak[i], troupe::bench::fma_peak_gflops(isas[i]));
  };
  struct Row {
    int64_t M;
    double flops;
    std::vector<Stats> total;                     // per path: all matrices
    std::vector<std::vector<Stats>> shape_stats;  // per shape, per path
  };
  std::vector<Row> rows;

  for (int64_t M : ms) {
    std::vector<at::Tensor> xs;
    for (const Shape& sh : kShapes) xs.push_back(at::randn({M, sh.in}));
    const int n = reps > 0 ? reps : (M <= 16 ? 30 : M <= 128 ? 10 : 4);
    // times[path][shape] per pass
    std::vector<std::vector<double>> times(static_cast<size_t>(n_paths * kShapeCount));
    auto pass = [&](int path, bool record) {
      for (int s = 0; s < kShapeCount; ++s) {
        const auto& ls = lin(path, s);
        const auto t0 = Clock::now();
        for (size_t c = 0; c < ls.size(); ++c) {
          at::Tensor y = ls[c].forward(xs[s], bias[s][c]);
          (void)y;
        }
        if (record) times[static_cast<size_t>(path * kShapeCount + s)].push_back(ms_since(t0));
      }
    };
    for (int r = 0; r < n + 1; ++r) pass(0, r > 0);  // pass 0 warms up
    // OpenBLAS's idle workers spin for a while (~0.1 s) after a call and
    // would take the cores from the packed kernels' OpenMP threads.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    measure_peaks();
    for (int r = 0; r < n + 1; ++r)
      for (int path = 1; path < n_paths; ++path) pass(path, r > 0);

    Row row{M, 0, std::vector<Stats>(static_cast<size_t>(n_paths)), {}};
    for (const Shape& sh : kShapes) row.flops += 2.0 * M * sh.in * sh.out * sh.count;
    for (int path = 0; path < n_paths; ++path) {
      std::vector<double> v(static_cast<size_t>(n), 0.0);
      for (int s = 0; s < kShapeCount; ++s)
        for (int r = 0; r < n; ++r)
          v[static_cast<size_t>(r)] +=
              times[static_cast<size_t>(path * kShapeCount + s)][static_cast<size_t>(r)];
      row.total[static_cast<size_t>(path)] = stats(v);
    }
    for (int s = 0; s < kShapeCount; ++s) {
      row.shape_stats.emplace_back();
      for (int path = 0; path < n_paths; ++path)
        row.shape_stats.back().push_back(stats(times[static_cast<size_t>(path * kShapeCount + s)]));
    }
    rows.push_back(std::move(row));
  }

  for (size_t i = 0; i < isas.size(); ++i)
    std::printf("FMA peak with %s instructions, %d threads (best of %zu measurements): %.1f GFLOP/s\n",
                to_string(isas[i]), at::get_num_threads(), ms.size(), peak[i]);
  std::printf(
      "\nms per pass over all 48 layer matrices + LM head, best (median) of the passes; GF/s of the best\n"
      "pass and its share of the variant's FMA peak; x = BLAS time / variant time\n\n");
  std::printf("%5s | %-28s", "M", "OpenBLAS");
  for (CpuIsa isa : isas) std::printf(" | %-36s", to_string(isa));
  std::printf("\n");
  for (const Row& row : rows) {
    const Stats& blas = row.total[0];
    std::printf("%5lld | %7.2f (%7.2f) %6.1f GF/s", static_cast<long long>(row.M), blas.best, blas.median,
                row.flops / blas.best * 1e-6);
    for (int path = 1; path < n_paths; ++path) {
      const Stats& t = row.total[static_cast<size_t>(path)];
      const double gf = row.flops / t.best * 1e-6;
      std::printf(" | %7.2f (%7.2f) %6.1f %3.0f%% %5.2fx", t.best, t.median, gf,
                  100.0 * gf / peak[static_cast<size_t>(path - 1)], blas.best / t.best);
    }
    std::printf("\n");
    if (per_shape)
      for (int s = 0; s < kShapeCount; ++s) {
        const double f = 2.0 * row.M * kShapes[s].in * kShapes[s].out * kShapes[s].count;
        std::printf("      %-22s", kShapes[s].name);
        for (int path = 0; path < n_paths; ++path) {
          const Stats& st = row.shape_stats[static_cast<size_t>(s)][static_cast<size_t>(path)];
          std::printf("  %s %8.3f ms %7.1f GF/s",
                      path == 0 ? "blas" : to_string(isas[static_cast<size_t>(path - 1)]), st.best,
                      f / st.best * 1e-6);
        }
        std::printf("\n");
      }
  }
  return 0;
}
