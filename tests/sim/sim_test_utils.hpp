#pragma once
// Helpers shared by the simulator's tests (torch-free).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cluster/sim/cost_model.hpp"
#include "cluster/sim/cost_profile.hpp"
#include "cluster/sim/sim_report.hpp"
#include "cluster/sim/simulator.hpp"
#include "cluster/sim/workload.hpp"

namespace troupe::cluster::sim::test {

inline std::string fixture(const std::string& name) { return std::string(TROUPE_SIM_FIXTURES) + "/" + name; }

// A file with the given contents, removed at the end of the scope.
struct TempFile {
  explicit TempFile(const std::string& contents, const std::string& suffix = ".txt") {
    char name[] = "/tmp/troupe_sim_XXXXXX";
    const int fd = mkstemp(name);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    close(fd);
    std::remove(name);
    path = std::string(name) + suffix;
    std::ofstream(path) << contents;
  }
  ~TempFile() { std::remove(path.c_str()); }
  std::string path;
};

// A request of `in` prompt and `out` output tokens sent at `at_ns`.
inline WorkloadRequest request(int64_t at_ns, int32_t in, int32_t out) {
  WorkloadRequest r;
  r.arrival_ns = at_ns;
  r.input_len = in;
  r.output_len = out;
  return r;
}

// A worker whose every step takes `step_ns`, whatever it holds.
inline std::shared_ptr<const CostModel> constant_cost(double step_ns) {
  auto m = std::make_shared<CostModel>();
  m->knots = {1};
  m->knot_ns = {step_ns};
  return m;
}

inline SimWorkerSpec worker(std::shared_ptr<const CostModel> cost, int32_t num_blocks = 256,
                            int32_t max_model_len = 1024) {
  SimWorkerSpec w;
  w.node = "n";
  w.device = "test";
  w.cost = std::move(cost);
  w.scheduler.num_blocks = num_blocks;
  w.scheduler.block_size = 16;
  w.scheduler.max_model_len = max_model_len;
  w.scheduler.vocab_size = 50257;
  w.scheduler.max_steps_in_flight = 2;
  return w;
}

// A memory size parser that knows "1MiB" only (the cluster and events files').
inline int64_t parse_memory(const std::string& text) {
  if (text == "1MiB") return 1 << 20;
  throw std::invalid_argument("bad size '" + text + "'");
}

// A profile of 1 ms steps, 1 KiB of KV per token.
inline CostProfile small_profile(int32_t block_size = 16, int32_t n_positions = 128) {
  CostProfile p;
  p.device = "cpu";
  p.model.n_positions = n_positions;
  p.block_size = block_size;
  p.kv_bytes_per_token = 1024;
  p.cost.knots = {1};
  p.cost.knot_ns = {1e6};
  return p;
}

// Four workers of 5 ms steps (64 blocks each, round-robin), 200 requests
// over ~4 s: a fault or an event at 1 s strikes a busy cluster.
inline std::vector<WorkloadRequest> fault_workload() {
  SyntheticOptions so;
  so.num_requests = 200;
  so.request_rate = 50;
  so.seed = 9;
  so.input = parse_length_distribution("uniform:80:0.5");
  so.output = parse_length_distribution("uniform:40:0.5");
  return generate_synthetic(so);
}

inline SimOptions four_workers() {
  SimOptions o;
  for (int i = 0; i < 4; ++i) o.workers.push_back(worker(constant_cost(5'000'000), 64));
  o.batcher.placement = core::PlacementPolicy::kRoundRobin;
  return o;
}

// Poisson arrivals of `n` one-token requests of 16 prompt tokens, `rate` a second.
inline std::vector<WorkloadRequest> one_token_requests(int32_t n, double rate, uint64_t seed) {
  SyntheticOptions so;
  so.num_requests = n;
  so.request_rate = rate;
  so.seed = seed;
  so.input = parse_length_distribution("16");
  so.output = parse_length_distribution("1");
  return generate_synthetic(so);
}

// The mean of correlated samples (queue waits) and its standard error from
// the means of 40 consecutive batches.
struct BatchMeans {
  double mean = 0, se = 0;
};
inline BatchMeans batch_means(const std::vector<double>& x) {
  const size_t batches = 40, per = x.size() / batches;
  std::vector<double> means;
  for (size_t b = 0; b < batches; ++b) {
    double s = 0;
    for (size_t i = b * per; i < (b + 1) * per; ++i) s += x[i];
    means.push_back(s / static_cast<double>(per));
  }
  BatchMeans r;
  for (double m : means) r.mean += m;
  r.mean /= batches;
  double var = 0;
  for (double m : means) var += (m - r.mean) * (m - r.mean);
  r.se = std::sqrt(var / (batches - 1) / batches);
  return r;
}

// The whole report, as `troupe simulate --json` writes it (without its config).
inline std::string json_of(const SimResult& r) {
  return simulation_json(r, simulation_metrics(r, {}), {}).dump();
}

}  // namespace troupe::cluster::sim::test
