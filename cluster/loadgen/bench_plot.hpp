#pragma once
// Plots of a load test through gnuplot (gnuplot-nox): each figure as PNG and
// SVG, beside the .dat and .gp files it was drawn from (so it can be redrawn
// or restyled by hand).
//
//   latency_cdf   CDFs of TTFT, TPOT, ITL and E2EL (ms), one panel each
//   throughput    output tokens per second and requests in flight, over the run
//   sweep         TPOT and TTFT (median, p99) against output tokens/s, one point
//                 per request rate (light load -> saturation)
#include <string>
#include <vector>

#include "core/serving_metrics.hpp"

namespace troupe::cluster {

// `dir` is created if missing. std::runtime_error when gnuplot fails or is
// missing (install gnuplot-nox).
void plot_run(const std::string& dir, const std::vector<core::RequestTiming>& requests,
              const std::string& title);

struct SweepPoint {
  std::string rate;  // as given ("4", "inf")
  core::ServingMetrics metrics;
};
void plot_sweep(const std::string& dir, const std::vector<SweepPoint>& points, const std::string& title);

}  // namespace troupe::cluster
