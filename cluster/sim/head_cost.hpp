#pragma once
// The head's own cost (`troupe profile --head`, read by `troupe simulate
// --head-cost`): the CPU a real head spends per event, fitted from runs of a
// real head with emulated workers,
//
//   head CPU = idle_share × wall + request_ns × requests + step_ns × step results
//              + token_ns × tokens generated
//
// (requests: taken in, placed and ended; a step result: received, applied,
// the worker's next step planned and sent; a token: routed to its request,
// detokenised and streamed to its client; idle: heartbeats and timers). The
// simulator charges the per-event terms to the head as one server with a
// queue, slowed by the idle share (docs/simulation.md, "The head").
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::cluster::sim {

struct HeadCost {
  double request_ns = 0;  // per request
  double step_ns = 0;     // per step result
  double token_ns = 0;    // per generated token
  double idle_share = 0;  // of one CPU, busy with no traffic; [0, 1)
  bool free() const { return request_ns <= 0 && step_ns <= 0 && token_ns <= 0; }
  // The head's time for an event of that CPU cost: cost / (1 - idle_share).
  int64_t service_ns(double cpu_ns) const;
};

// One measured run of a real head: its CPU over the run and what it served.
struct HeadRun {
  int32_t workers = 0, in_flight = 0, output_len = 0;  // the run's setting (reports)
  double wall_s = 0, cpu_s = 0;                        // the head process's user + system CPU
  int64_t requests = 0, steps = 0, tokens = 0;
};

struct HeadProfile {
  static constexpr int kVersion = 1;
  std::string created, processor;
  std::string setup;  // how the runs were made (workers' profile, time scale, CPU pinning)
  HeadCost cost;
  std::vector<HeadRun> runs;
  double fit_median_pct = 0, fit_max_pct = 0;  // |fitted - measured| / measured over the runs

  nlohmann::ordered_json to_json() const;
  static HeadProfile from_json(const nlohmann::json& j);  // std::runtime_error naming the field
};

// The cost that explains the runs best (non-negative least squares on
// relative errors), and its error on them. std::invalid_argument with fewer
// than 4 runs or a run without CPU or wall time.
HeadCost fit_head_cost(const std::vector<HeadRun>& runs);
// What the cost predicts for a run's CPU seconds.
double predicted_cpu_s(const HeadCost& cost, const HeadRun& run);
// Fits `p.runs` into p.cost and its errors.
void fit(HeadProfile& p);

HeadProfile read_head_profile(const std::string& path);  // std::runtime_error naming the file
void write_head_profile(const std::string& path, const HeadProfile& p);

}  // namespace troupe::cluster::sim
