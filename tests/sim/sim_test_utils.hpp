#pragma once
// Helpers shared by the simulator's tests (torch-free).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cluster/sim/cost_model.hpp"
#include "cluster/sim/simulator.hpp"

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

}  // namespace troupe::cluster::sim::test
