#pragma once
// What `troupe simulate` writes: the serving metrics under vLLM's result keys
// (core/serving_metrics.hpp, so scripts written for `vllm bench serve` and
// `troupe bench` read it), plus the cluster's side: per-worker utilisation,
// KV use, preemptions, prefix-cache hits, queue time, and the time series.
// JSON for programs, CSV for spreadsheets, text for people. Every output is a
// pure function of the result (no wall-clock times), so equal runs give
// equal bytes.
#include <string>

#include <nlohmann/json.hpp>

#include "cluster/sim/simulator.hpp"
#include "core/serving_metrics.hpp"

namespace troupe::cluster::sim {

struct ReportOptions {
  core::MetricsOptions metrics;   // percentiles, SLOs
  bool itls = false;              // every request's inter-token gaps in the JSON (large on long runs)
  nlohmann::ordered_json config;  // the run's description (workload, cluster, seed), stored as "simulation"
};

// Metrics of a simulation, over its run (first send to last response).
core::ServingMetrics simulation_metrics(const SimResult& result, const core::MetricsOptions& options);

nlohmann::ordered_json simulation_json(const SimResult& result, const core::ServingMetrics& metrics,
                                       const ReportOptions& options);

// series.csv (one row per sample, per-worker columns), workers.csv and
// requests.csv in `dir` (created). Throws std::runtime_error on a write error.
void write_csv_reports(const std::string& dir, const SimResult& result);

// The cluster's side for people: one line per worker (at most `max_rows`,
// then a summary of the rest) and the totals.
std::string format_cluster_summary(const SimResult& result, size_t max_rows = 16);

// The faults' side (empty without faults): what each did, and the latencies
// of the requests they moved beside the others'.
std::string format_fault_summary(const SimResult& result);
nlohmann::ordered_json fault_json(const SimResult& result);

}  // namespace troupe::cluster::sim
