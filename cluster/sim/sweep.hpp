#pragma once
// Capacity questions answered by repeated simulation: the highest request
// rate a cluster serves within its SLOs (--sweep), and the fewest workers
// that serve a rate within them (--find-workers).
//
// A run meets the SLOs when at least `attainment` of all its requests
// completed and met every target (DistServe's "SLO attainment", Zhong et al.,
// OSDI 2024, which uses 90%); with no targets, when every request completed.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/serving_metrics.hpp"

namespace troupe::cluster::sim {

struct SloCheck {
  core::SloTargets slo;
  double attainment = 0.9;  // (0, 1]
};

// Fraction of `total` requests that completed within every target.
double attainment(const core::ServingMetrics& m, int32_t total, const SloCheck& check);
bool meets(const core::ServingMetrics& m, int32_t total, const SloCheck& check);

// "rate=A:B:STEP" -> A, A+STEP, ..., up to B (inclusive within rounding).
// Throws std::invalid_argument on anything else (A > 0, STEP > 0, B >= A).
std::vector<double> parse_rate_sweep(const std::string& spec);

struct SweepPoint {
  double rate = 0;
  core::ServingMetrics metrics;
  double attainment = 0;
  bool meets = false;
};

// Runs `run(rate)` for every rate, in order.
std::vector<SweepPoint> sweep_rates(const std::vector<double>& rates,
                                    const std::function<core::ServingMetrics(double)>& run, int32_t total,
                                    const SloCheck& check);
// The highest rate of the sweep whose run met the SLOs, or -1.
double highest_rate_meeting(const std::vector<SweepPoint>& points);

// The smallest n in [1, max_n] with ok(n), assuming ok is monotone (more
// workers never hurt): doubling, then bisection. -1 when even max_n fails.
// `ok` is called O(log max_n) times; `seen` (optional) records each call.
int32_t smallest_passing(int32_t max_n, const std::function<bool(int32_t)>& ok,
                         std::vector<std::pair<int32_t, bool>>* seen = nullptr);

}  // namespace troupe::cluster::sim
