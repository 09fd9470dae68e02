#include "cluster/sim/sweep.hpp"

#include <cmath>
#include <map>
#include <stdexcept>

#include "cluster/sim/parse_number.hpp"

namespace troupe::cluster::sim {

double attainment(const core::ServingMetrics& m, int32_t total, const SloCheck& check) {
  if (total <= 0) return 0;
  const int32_t good = check.slo.empty() ? m.completed : m.good_requests;
  return static_cast<double>(good) / total;
}

bool meets(const core::ServingMetrics& m, int32_t total, const SloCheck& check) {
  if (check.slo.empty()) return m.completed == total;
  return attainment(m, total, check) >= check.attainment;
}

std::vector<double> parse_rate_sweep(const std::string& spec) {
  const std::string what = "--sweep '" + spec + "': expected rate=A:B:STEP with 0 < A <= B and STEP > 0";
  if (spec.rfind("rate=", 0) != 0) throw std::invalid_argument(what);
  const std::string body = spec.substr(5);
  const size_t c1 = body.find(':'), c2 = c1 == std::string::npos ? c1 : body.find(':', c1 + 1);
  if (c2 == std::string::npos) throw std::invalid_argument(what);
  const auto a = parse_number(body.substr(0, c1)), b = parse_number(body.substr(c1 + 1, c2 - c1 - 1)),
             step = parse_number(body.substr(c2 + 1));
  if (!a || !b || !step || *a <= 0 || *b < *a || *step <= 0) throw std::invalid_argument(what);
  const auto n = static_cast<int64_t>(std::floor((*b - *a) / *step + 1e-9)) + 1;
  if (n > 10000) throw std::invalid_argument(what + " (at most 10000 rates)");
  std::vector<double> rates;
  for (int64_t i = 0; i < n; ++i) rates.push_back(*a + static_cast<double>(i) * *step);
  return rates;
}

std::vector<SweepPoint> sweep_rates(const std::vector<double>& rates,
                                    const std::function<core::ServingMetrics(double)>& run, int32_t total,
                                    const SloCheck& check) {
  std::vector<SweepPoint> out;
  for (double rate : rates) {
    SweepPoint p;
    p.rate = rate;
    p.metrics = run(rate);
    p.attainment = attainment(p.metrics, total, check);
    p.meets = meets(p.metrics, total, check);
    out.push_back(std::move(p));
  }
  return out;
}

double highest_rate_meeting(const std::vector<SweepPoint>& points) {
  double best = -1;
  for (const auto& p : points)
    if (p.meets && p.rate > best) best = p.rate;
  return best;
}

int32_t smallest_passing(int32_t max_n, const std::function<bool(int32_t)>& ok,
                         std::vector<std::pair<int32_t, bool>>* seen) {
  if (max_n < 1) throw std::invalid_argument("the largest cluster to try must have >= 1 worker");
  std::map<int32_t, bool> memo;
  auto test = [&](int32_t n) {
    auto it = memo.find(n);
    if (it != memo.end()) return it->second;
    const bool r = ok(n);
    memo[n] = r;
    if (seen) seen->emplace_back(n, r);
    return r;
  };
  int32_t lo = 0, hi = 1;  // ok(lo) false (or lo = 0), ok(hi) unknown
  while (!test(hi)) {
    if (hi == max_n) return -1;
    lo = hi;
    hi = static_cast<int32_t>(std::min<int64_t>(int64_t{hi} * 2, max_n));
  }
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (test(mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

}  // namespace troupe::cluster::sim
