#include "cluster/sim/head_cost.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

#include "cluster/sim/least_squares.hpp"
#include "core/serving_metrics.hpp"

namespace troupe::cluster::sim {

using nlohmann::json;
using nlohmann::ordered_json;

int64_t HeadCost::service_ns(double cpu_ns) const {
  return std::llround(cpu_ns / (1.0 - idle_share));
}

double predicted_cpu_s(const HeadCost& c, const HeadRun& r) {
  return c.idle_share * r.wall_s +
         (c.request_ns * static_cast<double>(r.requests) + c.step_ns * static_cast<double>(r.steps) +
          c.token_ns * static_cast<double>(r.tokens)) /
             1e9;
}

HeadCost fit_head_cost(const std::vector<HeadRun>& runs) {
  if (runs.size() < 4) throw std::invalid_argument("head cost: 4 runs at least to fit 4 terms");
  // Each row divided by the run's CPU: the fit weighs every run's relative error alike.
  Matrix a;
  std::vector<double> b;
  for (const HeadRun& r : runs) {
    if (!(r.cpu_s > 0) || !(r.wall_s > 0)) throw std::invalid_argument("head cost: a run without CPU or wall time");
    const double w = 1.0 / r.cpu_s;
    a.push_back({r.wall_s * w, static_cast<double>(r.requests) * w / 1e9, static_cast<double>(r.steps) * w / 1e9,
                 static_cast<double>(r.tokens) * w / 1e9});
    b.push_back(1.0);
  }
  const std::vector<double> x = nonnegative_least_squares(a, b);
  HeadCost c;
  c.idle_share = std::min(x[0], 0.9);
  c.request_ns = x[1];
  c.step_ns = x[2];
  c.token_ns = x[3];
  return c;
}

void fit(HeadProfile& p) {
  p.cost = fit_head_cost(p.runs);
  std::vector<double> err;
  for (const HeadRun& r : p.runs) err.push_back(100 * std::fabs(predicted_cpu_s(p.cost, r) - r.cpu_s) / r.cpu_s);
  p.fit_median_pct = core::percentile(err, 50);
  p.fit_max_pct = core::percentile(err, 100);
}

ordered_json HeadProfile::to_json() const {
  ordered_json j;
  j["format"] = "troupe-head-profile";
  j["version"] = kVersion;
  j["created"] = created;
  j["processor"] = processor;
  j["setup"] = setup;
  j["head_cost"] = {{"request_ns", cost.request_ns},
                    {"step_ns", cost.step_ns},
                    {"token_ns", cost.token_ns},
                    {"idle_share", cost.idle_share}};
  j["fit_error_pct"] = {{"median", fit_median_pct}, {"max", fit_max_pct}};
  ordered_json rs = ordered_json::array();
  for (const HeadRun& r : runs)
    rs.push_back({{"workers", r.workers},   {"in_flight", r.in_flight}, {"output_len", r.output_len},
                  {"wall_s", r.wall_s},     {"cpu_s", r.cpu_s},         {"requests", r.requests},
                  {"steps", r.steps},       {"tokens", r.tokens},       {"fitted_cpu_s", predicted_cpu_s(cost, r)}});
  j["runs"] = std::move(rs);
  return j;
}

HeadProfile HeadProfile::from_json(const json& j) {
  HeadProfile p;
  try {
    if (j.at("format").get<std::string>() != "troupe-head-profile")
      throw std::runtime_error("\"format\" is not troupe-head-profile (a worker's cost profile goes to --cost)");
    if (j.at("version").get<int>() != kVersion)
      throw std::runtime_error("version " + std::to_string(j.at("version").get<int>()) + " (this troupe reads " +
                               std::to_string(kVersion) + ")");
    p.created = j.at("created").get<std::string>();
    p.processor = j.at("processor").get<std::string>();
    p.setup = j.at("setup").get<std::string>();
    const json& c = j.at("head_cost");
    p.cost.request_ns = c.at("request_ns").get<double>();
    p.cost.step_ns = c.at("step_ns").get<double>();
    p.cost.token_ns = c.at("token_ns").get<double>();
    p.cost.idle_share = c.at("idle_share").get<double>();
    p.fit_median_pct = j.at("fit_error_pct").at("median").get<double>();
    p.fit_max_pct = j.at("fit_error_pct").at("max").get<double>();
    for (const json& r : j.at("runs")) {
      HeadRun x;
      x.workers = r.at("workers").get<int32_t>();
      x.in_flight = r.at("in_flight").get<int32_t>();
      x.output_len = r.at("output_len").get<int32_t>();
      x.wall_s = r.at("wall_s").get<double>();
      x.cpu_s = r.at("cpu_s").get<double>();
      x.requests = r.at("requests").get<int64_t>();
      x.steps = r.at("steps").get<int64_t>();
      x.tokens = r.at("tokens").get<int64_t>();
      p.runs.push_back(x);
    }
  } catch (const json::exception& e) {
    throw std::runtime_error(std::string("head profile: ") + e.what());
  }
  const HeadCost& c = p.cost;
  if (!(c.request_ns >= 0 && c.step_ns >= 0 && c.token_ns >= 0 && c.idle_share >= 0 && c.idle_share < 1))
    throw std::runtime_error("head profile: costs must be >= 0 and idle_share in [0, 1)");
  return p;
}

HeadProfile read_head_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read head profile " + path);
  try {
    return HeadProfile::from_json(json::parse(in));
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

void write_head_profile(const std::string& path, const HeadProfile& p) {
  std::ofstream out(path);
  out << p.to_json().dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace troupe::cluster::sim
