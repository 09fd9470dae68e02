#pragma once
// Plots of a simulation through gnuplot (PNG and SVG of each): latency CDFs
// (TTFT, TPOT, E2EL), throughput and queue depth over time, KV use over time,
// and, for a sweep, latency and goodput against the request rate. The data
// (.dat) and gnuplot scripts (.gp) stay next to the images, so a figure can be
// restyled without simulating again.
#include <string>
#include <vector>

#include "cluster/sim/simulator.hpp"
#include "cluster/sim/sweep.hpp"

namespace troupe::cluster::sim {

// The path of gnuplot on PATH, or empty.
std::string find_gnuplot();

// Writes the run's plots into `dir` (created). Returns the image paths.
// Throws std::runtime_error when gnuplot is missing (saying how to install
// it) or fails.
std::vector<std::string> plot_simulation(const std::string& dir, const SimResult& result);
// Latency (median and p99 TTFT, TPOT) and goodput against the rate.
std::vector<std::string> plot_sweep(const std::string& dir, const std::vector<SweepPoint>& points);

}  // namespace troupe::cluster::sim
