// How fast the simulator runs: simulated seconds per wall second and events
// per second, for 100 workers under an hour of traffic at 80% of their
// capacity (target, issue 33: <= 30 s wall on the team's 2-core machine), and
// how wall time grows with the number of workers (1000 for five minutes:
// <= 60 s).
//
//   ./build/bench_sim [COST.json] [--hours H] [--scaling-seconds S (0: none)] [--workers 10,100,1000]
//                     [--only tables|no-tables]
//
// Without a cost file it uses the GPT-2 124M CPU profile shipped in
// docs/profiles/ (measured on the team's machine; docs/simulation.md).
// Each run is timed with the workers' SequenceTables (the default) and
// without (--no-worker-tables), alternating.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cluster/sim/cost_profile.hpp"
#include "cluster/sim/simulator.hpp"
#include "cluster/sim/workload.hpp"
#include "core/heap_pages.hpp"
#include "core/host_info.hpp"
#include "model/cpu_count.hpp"

namespace sim = troupe::cluster::sim;
using Clock = std::chrono::steady_clock;

namespace {

// The workers' tables go on a second thread when this process may use a
// second CPU (as `troupe simulate` decides).
bool tables_on_thread() { return troupe::model::usable_cpus() >= 2; }
// With a second CPU the run is parallel (two lanes) unless TROUPE_SIM_SERIAL is set (to compare).
bool parallel_run() { return tables_on_thread() && !std::getenv("TROUPE_SIM_SERIAL"); }

sim::SimOptions options(std::shared_ptr<const sim::CostModel> cost, int32_t workers, int32_t n_positions) {
  sim::SimOptions o;
  for (int32_t i = 0; i < workers; ++i) {
    sim::SimWorkerSpec w;
    w.node = "n" + std::to_string(i);
    w.device = "cpu";
    w.cost = cost;
    w.scheduler.num_blocks = 8192;  // 2 GiB of GPT-2 KV in 16-token blocks
    w.scheduler.max_model_len = n_positions;
    w.scheduler.max_steps_in_flight = 2;
    o.workers.push_back(w);
  }
  o.sample_interval_ns = 10'000'000'000;
  o.tables_on_thread = tables_on_thread();
  o.parallel = parallel_run();
  return o;
}

sim::SyntheticOptions workload(int32_t n, double rate) {
  sim::SyntheticOptions w;
  w.num_requests = n;
  w.request_rate = rate;
  w.seed = 1;
  w.input = sim::parse_length_distribution("uniform:256:0.5");
  w.output = sim::parse_length_distribution("uniform:128:0.5");
  return w;
}

struct Measured {
  double wall_s, sim_s;
  uint64_t events;
  int64_t steps, tokens;
};

Measured run(const sim::SimOptions& o, const std::vector<sim::WorkloadRequest>& w) {
  const auto t0 = Clock::now();
  const sim::SimResult r = sim::simulate(w, o);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  Measured m{wall, r.end_ns / 1e9, r.events, 0, 0};
  for (const auto& x : r.workers) {
    m.steps += x.steps;
    m.tokens += x.tokens_generated;
  }
  return m;
}

void print(const char* label, int32_t workers, const Measured& m) {
  std::printf("%-18s %7d %9.0f %9.2f %9.1f %11.3g %11.3g %11.3g %11.3g\n", label, workers, m.sim_s, m.wall_s,
              m.sim_s / m.wall_s, m.events / m.wall_s, m.steps / m.wall_s, static_cast<double>(m.tokens),
              m.tokens / m.wall_s);
}

}  // namespace

int main(int argc, char** argv) {
  // As `troupe simulate` does: huge pages (not with TROUPE_HEAP_THP=0) for its malloc, mimalloc's
  // (linked; glibc's with the deeper tcache in a sanitizer build).
  troupe::core::reexec_with_simulator_heap(argv);
  troupe::core::tune_malloc();  // as every troupe process does
  double hours = 1, scaling_seconds = 300, speedup = 1;
  std::vector<int32_t> scaling = {10, 100, 1000};
  std::string cost_path, only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--hours") && i + 1 < argc) {
      hours = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--scaling-seconds") && i + 1 < argc) {
      scaling_seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--speedup") && i + 1 < argc) {
      speedup = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];  // one of the two runs (for profiling)
      if (only != "tables" && only != "no-tables") {
        std::fprintf(stderr, "--only takes tables or no-tables\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--workers") && i + 1 < argc) {
      scaling.clear();
      std::stringstream ss(argv[++i]);
      std::string item;
      while (std::getline(ss, item, ',')) scaling.push_back(std::atoi(item.c_str()));
    } else if (argv[i][0] != '-' && cost_path.empty()) {
      cost_path = argv[i];
    } else {
      std::fprintf(stderr,
                   "usage: bench_sim [COST.json] [--hours H] [--workers 10,100,1000] [--scaling-seconds S]\n"
                   "                 [--speedup X] [--only tables|no-tables]\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  if (cost_path.empty()) cost_path = TROUPE_DEFAULT_COST;
  sim::CostProfile profile;
  try {
    profile = sim::read_cost_profile(cost_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sim: %s\n", e.what());
    return 2;
  }
  // --speedup X: what if every step took 1/X the time (a faster machine): more
  // capacity, so more requests and tokens per simulated hour.
  sim::CostModel scaled = profile.cost;
  for (double& v : scaled.knot_ns) v /= speedup;
  for (double* v : {&scaled.sample_ns, &scaled.decode_pair_ns, &scaled.prefill_pair_ns, &scaled.item_ns})
    *v /= speedup;
  const auto cost = std::make_shared<const sim::CostModel>(scaled);
  const int32_t n_positions = profile.model.n_positions;
  std::printf("cost model: %s (%s, %s), steps %gx as fast\n", cost_path.c_str(), profile.processor.c_str(),
              profile.thread_summary.c_str(), speedup);
  std::printf("running on: %s; %s\n", troupe::core::cpu_model_name().c_str(),
              parallel_run() ? "the workers' events in two lanes on two threads, the tables checked when a "
                               "thread would wait (docs/simulation.md, \"Two lanes\")"
              : tables_on_thread() ? "serial (TROUPE_SIM_SERIAL), the workers' tables on a second thread"
                                   : "serial, the workers' tables in line (one CPU)");
  const bool mimalloc = troupe::core::heap_allocator() == troupe::core::HeapAllocator::kMimalloc;
  const char* pages = !troupe::core::heap_huge_pages_requested()
                          ? "4 KiB pages (TROUPE_HEAP_THP=0, THP off, or set by the user)"
                      : mimalloc ? "transparent huge pages (MIMALLOC_LARGE_OS_PAGES=1)"
                                 : "transparent huge pages (glibc.malloc.hugetlb=1)";
  if (mimalloc) {
    std::printf("heap: mimalloc, %s\n", pages);
  } else {
    const std::string tcache = troupe::core::heap_tcache_count();
    std::printf("heap: glibc's malloc, %s, tcache %s per size and thread, malloc %s\n", pages,
                tcache.empty() ? "7 (glibc's default)" : tcache.c_str(),
                troupe::core::malloc_tuned() ? "tuned" : "default");
  }
  std::printf("workload: prompts uniform 128-384, outputs uniform 64-192 tokens, Poisson arrivals\n");

  // Capacity of one worker: everything at once, 2000 requests.
  const auto sat = sim::generate_synthetic(workload(2000, 1e9));
  const sim::SimResult cap = sim::simulate(sat, options(cost, 1, n_positions));
  const double capacity = 2000 / (cap.end_ns / 1e9);
  std::printf("capacity of one worker: %.3f req/s (saturated); runs at 80%% of it\n\n", capacity);

  std::printf("%-18s %7s %9s %9s %9s %11s %11s %11s %11s\n", "run", "workers", "sim s", "wall s", "sim/wall",
              "events/s", "steps/s", "tokens", "tokens/s");
  auto both = [&](const char* label, int32_t workers, const std::vector<sim::WorkloadRequest>& reqs) {
    sim::SimOptions o = options(cost, workers, n_positions);
    if (only != "no-tables") print((std::string(label) + " tables").c_str(), workers, run(o, reqs));
    o.worker_tables = false;
    if (only != "tables") print((std::string(label) + " no-tables").c_str(), workers, run(o, reqs));
  };
  const double rate100 = 0.8 * capacity * 100;
  both("headline", 100,
       sim::generate_synthetic(workload(static_cast<int32_t>(rate100 * 3600 * hours), rate100)));
  for (int32_t w : scaling) {
    if (scaling_seconds <= 0) break;  // --scaling-seconds 0: the headline runs only
    const double rate = 0.8 * capacity * w;
    both("scaling", w, sim::generate_synthetic(workload(static_cast<int32_t>(rate * scaling_seconds), rate)));
  }
  return 0;
}
