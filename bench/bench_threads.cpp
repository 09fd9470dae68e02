// bench_threads: how W workers in one process should share C CPUs (the
// distributed issue runs several workers per host). Each variant runs on its
// own crew of threads; the variants alternate rep by rep in one run:
//   1xC       one worker, C OpenMP threads and C BLAS threads;
//   Cx1       C workers, one OpenMP thread each, BLAS at 1 (split_thread_budget);
//   Cx1 blasC the same with OpenBLAS's process-wide pool at C threads;
//   CxC       C workers with C threads each: what W workers get without a
//             budget (C x C threads on C CPUs).
//  1. OpenBLAS GEMMs [M, 768] x [768, 3072] (the projections' path on CPUs
//     without troupe's packed kernel), the same total work split among the
//     workers, in GFLOP/s.
//  2. Engines (GPT-2 124M shape, fp32, random weights, greedy, distinct
//     16-token prompts): each worker owns a model copy, KV pool and engine, as
//     a worker actor will; the sequences are split among the workers; output
//     tokens/s, prefill included.
// Best and median per variant, and the median's ratio to 1xC.
//
//   build/bench_threads [--quick] [--cpus C] [--seqs N] [--new-tokens T] [--reps R]
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/engine.hpp"
#include "model/config.hpp"
#include "model/cpu_count.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/threading.hpp"
#include "model/weights.hpp"

using namespace troupe;
using Clock = std::chrono::steady_clock;

namespace {

// W threads that live for the whole bench (so libgomp's per-thread pools and
// ATen's per-thread init are paid once) and run one job each on demand.
class Crew {
 public:
  explicit Crew(int n) {
    for (int w = 0; w < n; ++w) threads_.emplace_back([this, w] { loop(w); });
  }
  ~Crew() {
    run(nullptr);
    for (auto& t : threads_) t.join();
  }
  // Runs job(w) on thread w for every w; returns when all have finished.
  void run(std::function<void(int)> job) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = std::move(job);
    pending_ = static_cast<int>(threads_.size());
    ++generation_;
    cv_.notify_all();
    done_cv_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void loop(int w) {
    uint64_t seen = 0;
    for (;;) {
      std::function<void(int)> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      if (job) job(w);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
      if (!job) return;
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void(int)> job_;
  uint64_t generation_ = 0;
  int pending_ = 0;
};

struct Workload {
  int seqs = 16;        // sequences in all, split among the workers
  int prompt = 16;      // prompt tokens each
  int new_tokens = 32;  // output tokens each
};

struct Variant {
  std::string name;
  std::vector<model::ThreadBudget> budgets;  // one per worker
  std::unique_ptr<Crew> crew;
  std::vector<double> rate;  // work per second, one per rep
};

std::vector<int32_t> distinct_prompt(uint64_t id, int len) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((id * 7919 + i * 104729 + 13) % 50000));
  return p;
}

// One worker's engine loaded with sequences [first, first + count) of the workload.
struct WorkerRun {
  model::PagedKvCache cache;
  actors::Engine engine;

  static core::SchedulerOptions options(const model::Gpt2Config& cfg, const Workload& wl, int count) {
    core::SchedulerOptions so;
    so.block_size = 16;
    so.num_blocks = count * ((wl.prompt + wl.new_tokens + 15) / 16 + 1) + 1;
    so.max_model_len = cfg.n_positions;
    so.vocab_size = cfg.vocab_size;
    so.eos_id = cfg.eos_token_id;
    so.enable_prefix_caching = false;
    return so;
  }
  WorkerRun(const model::Gpt2& gpt, const Workload& wl, int first, int count)
      : WorkerRun(gpt, wl, first, count, options(gpt.config(), wl, count)) {}
  WorkerRun(const model::Gpt2& gpt, const Workload& wl, int first, int count,
            const core::SchedulerOptions& so)
      : cache(gpt.config(), so.num_blocks, so.block_size, gpt.device()),
        engine(gpt, cache, nullptr, so, model::PagedAttention::kAuto) {
    for (int i = first; i < first + count; ++i) {
      core::Request r;
      r.id = i;
      r.prompt_ids = distinct_prompt(i, wl.prompt);
      r.max_tokens = wl.new_tokens;
      r.sampling.temperature = 0.0f;
      r.ignore_eos = true;
      if (auto err = engine.submit(r)) throw std::runtime_error(*err);
    }
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The ways to run C CPUs' worth of work, each on its own crew of threads.
std::vector<Variant> thread_variants(int cpus) {
  std::vector<Variant> out;
  const std::string c = std::to_string(cpus);
  out.push_back({"1x" + c, model::split_thread_budget(cpus, 1), nullptr, {}});
  if (cpus > 1) {
    auto split = model::split_thread_budget(cpus, cpus);
    out.push_back({c + "x1", split, nullptr, {}});
    for (auto& b : split) b.blas_threads = cpus;
    out.push_back({c + "x1 blas" + c, split, nullptr, {}});
    // No budget: every worker takes every CPU, cpus x cpus threads in all.
    out.push_back({c + "x" + c, std::vector<model::ThreadBudget>(cpus, {cpus, cpus}), nullptr, {}});
  }
  for (auto& v : out) v.crew = std::make_unique<Crew>(static_cast<int>(v.budgets.size()));
  return out;
}

// `reps` rounds; in each, every variant (first one rotating) applies its
// budgets, runs setup(workers, w) untimed and then job(w) timed on each of
// its threads, and records work / seconds.
template <class Setup, class Job>
void alternate(std::vector<Variant>& variants, int reps, double work, Setup setup, Job job) {
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t k = 0; k < variants.size(); ++k) {
      Variant& v = variants[(k + rep) % variants.size()];
      const int workers = static_cast<int>(v.budgets.size());
      v.crew->run([&](int w) {
        model::apply_thread_budget(v.budgets[w]);
        setup(workers, w);
      });
      auto t0 = Clock::now();
      v.crew->run([&](int w) { job(w); });
      v.rate.push_back(work / std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
}

void report(const std::vector<Variant>& variants, const char* unit) {
  const double base = median(variants[0].rate);
  std::printf("   %-12s %12s %12s %10s\n", "workers", (std::string("best ") + unit).c_str(), "median",
              ("vs " + variants[0].name).c_str());
  for (const auto& v : variants) {
    std::printf("   %-12s %12.1f %12.1f %9.2fx\n", v.name.c_str(),
                *std::max_element(v.rate.begin(), v.rate.end()), median(v.rate), median(v.rate) / base);
  }
}

// 2. Engines: each worker its own model copy, KV pool and engine.
void bench_engines(const std::vector<std::unique_ptr<model::Gpt2>>& models, const Workload& wl, int cpus,
                   int reps) {
  std::printf("2. engines: %d sequences in all, %d-token prompts, %d new tokens each, greedy\n", wl.seqs,
              wl.prompt, wl.new_tokens);
  auto variants = thread_variants(cpus);
  std::vector<std::unique_ptr<WorkerRun>> runs(cpus);
  alternate(
      variants, reps, wl.seqs * wl.new_tokens,
      [&](int workers, int w) {
        const int first = wl.seqs * w / workers, last = wl.seqs * (w + 1) / workers;
        runs[w] = std::make_unique<WorkerRun>(*models[w], wl, first, last - first);
      },
      [&](int w) { runs[w]->engine.run_until_idle(); });
  report(variants, "tok/s");
  std::printf("   output tokens/s, prefill included; the distributed issue's target: %dx1 >= 0.9x 1x%d\n\n",
              cpus, cpus);
}

// 1. GEMMs through OpenBLAS, the projections' path where troupe's packed
// kernel does not run: the same number of [M, 768] x [768, 3072] products,
// one caller with BLAS's pool or C callers at once.
void bench_blas(int cpus, int reps) {
  std::printf("1. OpenBLAS GEMMs [M x 768] x [768 x 3072], the same total work per variant\n");
  for (int m : {16, 128}) {
    const int total = m == 16 ? 64 * cpus : 8 * cpus;
    auto variants = thread_variants(cpus);
    std::vector<torch::Tensor> a(cpus), b(cpus), c(cpus);
    int per_worker = 0;
    alternate(
        variants, reps, 2.0 * m * 768 * 3072 * total / 1e9,
        [&](int workers, int w) {
          a[w] = torch::randn({m, 768});
          b[w] = torch::randn({768, 3072});
          c[w] = torch::empty({m, 3072});
          per_worker = total / workers;
        },
        [&](int w) {
          for (int i = 0; i < per_worker; ++i) at::mm_out(c[w], a[w], b[w]);
        });
    std::printf("   M = %d (%d products)\n", m, total);
    report(variants, "GFLOP/s");
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  model::init_numerics_process(argc, argv);
  Workload wl;
  int cpus = model::usable_cpus(), reps = 5;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (!std::strcmp(argv[i], "--quick")) {
      reps = 3;
      wl.new_tokens = 16;
    } else if (!std::strcmp(argv[i], "--cpus")) {
      cpus = next();
    } else if (!std::strcmp(argv[i], "--seqs")) {
      wl.seqs = next();
    } else if (!std::strcmp(argv[i], "--new-tokens")) {
      wl.new_tokens = next();
    } else if (!std::strcmp(argv[i], "--reps")) {
      reps = next();
    } else {
      std::fprintf(stderr,
                   "usage: bench_threads [--quick] [--cpus C] [--seqs N] [--new-tokens T] [--reps R]\n");
      return 2;
    }
  }
  if (cpus < 1 || wl.seqs < cpus || wl.new_tokens < 1 || reps < 1) {
    std::fprintf(stderr, "bench_threads: need cpus >= 1, seqs >= cpus, new tokens >= 1, reps >= 1\n");
    return 2;
  }
  model::configure_threads({});
  std::printf("bench_threads: GPT-2 124M shape, fp32, cpu, %s\n", model::thread_summary());
  const char* timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  std::printf(
      "   %d CPUs split as workers x threads; %d reps, variants alternating; OPENBLAS_THREAD_TIMEOUT=%s\n\n",
      cpus, reps, timeout ? timeout : "unset");
  bench_blas(cpus, reps);
  const auto cfg = model::Gpt2Config::preset("gpt2");
  const auto weights = model::Gpt2Weights::random(cfg, 1);
  std::vector<std::unique_ptr<model::Gpt2>> models;
  for (int w = 0; w < cpus; ++w) models.push_back(std::make_unique<model::Gpt2>(cfg, weights, torch::kCPU));
  bench_engines(models, wl, cpus, reps);
  return 0;
}
