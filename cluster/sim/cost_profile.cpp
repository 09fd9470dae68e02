#include "cluster/sim/cost_profile.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

#include "core/serving_metrics.hpp"

namespace troupe::cluster::sim {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ordered_json shape_json(const StepShape& s) {
  return {{"tokens", s.tokens},
          {"items", s.items},
          {"sample_rows", s.sample_rows},
          {"decode_pairs", s.decode_pairs},
          {"prefill_pairs", s.prefill_pairs}};
}

ordered_json step_json(const MeasuredStep& m) {
  return {{"prefill_tokens", m.prefill_tokens},
          {"prefill_seqs", m.prefill_seqs},
          {"decode_seqs", m.decode_seqs},
          {"decode_context", m.decode_context},
          {"shape", shape_json(m.sample.shape)},
          {"median_ns", m.sample.ns},
          {"reps_ns", m.reps_ns}};
}

ordered_json error_json(const FitError& e) {
  return {{"points", e.points}, {"median_pct", e.median_pct}, {"p90_pct", e.p90_pct}, {"max_pct", e.max_pct}};
}

[[noreturn]] void bad(const std::string& what) { throw std::runtime_error("cost profile: " + what); }

const json& field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) bad(std::string("missing \"") + key + "\"");
  return j[key];
}

template <class T>
T get(const json& j, const char* key) {
  const json& v = field(j, key);
  try {
    return v.get<T>();
  } catch (const json::exception&) {
    bad(std::string("\"") + key + "\" has the wrong type");
  }
}

MeasuredStep step_from(const json& j) {
  MeasuredStep m;
  m.prefill_tokens = get<int32_t>(j, "prefill_tokens");
  m.prefill_seqs = get<int32_t>(j, "prefill_seqs");
  m.decode_seqs = get<int32_t>(j, "decode_seqs");
  m.decode_context = get<int64_t>(j, "decode_context");
  const json& s = field(j, "shape");
  m.sample.shape.tokens = get<int64_t>(s, "tokens");
  m.sample.shape.items = get<int32_t>(s, "items");
  m.sample.shape.sample_rows = get<int32_t>(s, "sample_rows");
  m.sample.shape.decode_pairs = get<int64_t>(s, "decode_pairs");
  m.sample.shape.prefill_pairs = get<int64_t>(s, "prefill_pairs");
  m.sample.ns = get<double>(j, "median_ns");
  m.reps_ns = get<std::vector<double>>(j, "reps_ns");
  return m;
}

FitError error_from(const json& j) {
  FitError e;
  e.points = get<size_t>(j, "points");
  e.median_pct = get<double>(j, "median_pct");
  e.p90_pct = get<double>(j, "p90_pct");
  e.max_pct = get<double>(j, "max_pct");
  return e;
}

}  // namespace

RepStat parse_rep_stat(const std::string& text) {
  if (text == "min") return RepStat::kMin;
  if (text == "median") return RepStat::kMedian;
  throw std::invalid_argument("the statistic of repetitions must be min or median, got '" + text + "'");
}

const char* to_string(RepStat stat) { return stat == RepStat::kMin ? "min" : "median"; }

namespace {
double rep_time(RepStat stat, std::vector<double> reps) {
  return stat == RepStat::kMin ? *std::min_element(reps.begin(), reps.end()) : core::percentile(reps, 50);
}
}  // namespace

void refit(CostProfile& p, RepStat stat) {
  auto of = [stat](const std::vector<double>& reps) { return rep_time(stat, reps); };
  if (p.fit_points.empty()) throw std::invalid_argument("refit: the profile has no fit points");
  int64_t largest = 1;
  std::vector<CostSample> fit, held;
  for (auto* points : {&p.fit_points, &p.heldout_points}) {
    for (MeasuredStep& m : *points) {
      if (m.reps_ns.empty()) throw std::invalid_argument("refit: a point has no repetitions");
      m.sample.ns = of(m.reps_ns);
      largest = std::max(largest, m.sample.shape.tokens);
      (points == &p.fit_points ? fit : held).push_back(m.sample);
    }
  }
  p.stat = stat;
  p.cost = CostModel::fit(CostModel::knots_up_to(largest), fit);
  p.calibration = {};
  p.fit_error = fit_error(p.cost, fit);
  p.heldout_error = fit_error(p.cost, held);
  std::vector<double> diff;
  for (const auto* points : {&p.fit_points, &p.heldout_points}) {
    for (const MeasuredStep& m : *points) {
      if (m.reps_ns.size() < 2) continue;
      std::vector<double> even, odd;
      for (size_t i = 0; i < m.reps_ns.size(); ++i) (i % 2 ? odd : even).push_back(m.reps_ns[i]);
      const double a = of(even), b = of(odd);
      diff.push_back(100 * std::fabs(a - b) / std::min(a, b));
    }
  }
  p.repeatability = {};
  p.repeatability.points = diff.size();
  if (!diff.empty()) {
    p.repeatability.median_pct = core::percentile(diff, 50);
    p.repeatability.p90_pct = core::percentile(diff, 90);
    p.repeatability.max_pct = diff.back();
  }
}

ordered_json CostProfile::to_json() const {
  ordered_json j;
  j["format"] = "troupe-cost-profile";
  j["version"] = kVersion;
  j["created"] = created;
  j["device"] = device;
  j["dtype"] = dtype;
  j["kv_cache_dtype"] = kv_cache_dtype;
  j["processor"] = processor;
  j["threads"] = threads;
  j["thread_summary"] = thread_summary;
  j["libraries"] = libraries;
  j["model"] = {{"n_layer", model.n_layer},       {"n_head", model.n_head},
                {"n_embd", model.n_embd},         {"n_positions", model.n_positions},
                {"vocab_size", model.vocab_size}, {"eos_token_id", model.eos_token_id}};
  j["block_size"] = block_size;
  j["kv_bytes_per_token"] = kv_bytes_per_token;
  j["sampling"] = sampling;
  j["rep_stat"] = to_string(stat);
  j["cost_model"] = cost.to_json();
  j["fit_error"] = error_json(fit_error);
  j["heldout_error"] = error_json(heldout_error);
  j["repeatability"] = error_json(repeatability);
  if (calibration.steps > 0) {
    j["served_calibration"] = {{"steps", calibration.steps},
                               {"source", calibration.source},
                               {"error_before", error_json(calibration.before)},
                               {"error_after", error_json(calibration.after)}};
  }
  ordered_json fit = ordered_json::array(), held = ordered_json::array();
  for (const auto& m : fit_points) fit.push_back(step_json(m));
  for (const auto& m : heldout_points) held.push_back(step_json(m));
  j["fit_points"] = std::move(fit);
  j["heldout_points"] = std::move(held);
  return j;
}

CostProfile CostProfile::from_json(const json& j) {
  if (get<std::string>(j, "format") != "troupe-cost-profile") bad("\"format\" is not troupe-cost-profile");
  if (get<int>(j, "version") != kVersion)
    bad("version " + std::to_string(get<int>(j, "version")) + " (this troupe reads " +
        std::to_string(kVersion) + ")");
  CostProfile p;
  p.created = get<std::string>(j, "created");
  p.device = get<std::string>(j, "device");
  if (j.contains("dtype")) p.dtype = get<std::string>(j, "dtype");  // absent: a profile from before --dtype
  if (j.contains("kv_cache_dtype")) p.kv_cache_dtype = get<std::string>(j, "kv_cache_dtype");  // the same
  p.processor = get<std::string>(j, "processor");
  p.threads = get<int32_t>(j, "threads");
  p.thread_summary = get<std::string>(j, "thread_summary");
  p.libraries = get<std::map<std::string, std::string>>(j, "libraries");
  const json& m = field(j, "model");
  p.model.n_layer = get<int32_t>(m, "n_layer");
  p.model.n_head = get<int32_t>(m, "n_head");
  p.model.n_embd = get<int32_t>(m, "n_embd");
  p.model.n_positions = get<int32_t>(m, "n_positions");
  p.model.vocab_size = get<int32_t>(m, "vocab_size");
  p.model.eos_token_id = get<int32_t>(m, "eos_token_id");
  if (p.model.n_positions < 1 || p.model.vocab_size < 1)
    bad("the model's n_positions and vocab_size must be >= 1");
  p.block_size = get<int32_t>(j, "block_size");
  p.kv_bytes_per_token = get<int64_t>(j, "kv_bytes_per_token");
  if (p.block_size < 1 || p.kv_bytes_per_token < 1) bad("block_size and kv_bytes_per_token must be >= 1");
  p.sampling = get<std::string>(j, "sampling");
  try {
    p.stat = parse_rep_stat(get<std::string>(j, "rep_stat"));
  } catch (const std::invalid_argument& e) {
    bad(e.what());
  }
  p.cost = CostModel::from_json(field(j, "cost_model"));
  p.fit_error = error_from(field(j, "fit_error"));
  p.heldout_error = error_from(field(j, "heldout_error"));
  p.repeatability = error_from(field(j, "repeatability"));
  if (j.contains("served_calibration")) {
    const json& c = field(j, "served_calibration");
    p.calibration.steps = get<size_t>(c, "steps");
    p.calibration.source = get<std::string>(c, "source");
    p.calibration.before = error_from(field(c, "error_before"));
    p.calibration.after = error_from(field(c, "error_after"));
  }
  for (const auto& x : field(j, "fit_points")) p.fit_points.push_back(step_from(x));
  for (const auto& x : field(j, "heldout_points")) p.heldout_points.push_back(step_from(x));
  return p;
}

std::vector<CostSample> read_step_log(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("step log " + path + ": cannot read it");
  std::vector<CostSample> out;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto fail = [&](const std::string& why) {
      throw std::runtime_error("step log " + path + " line " + std::to_string(no) + ": " + why);
    };
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("not a JSON object");
    auto items = j.find("items");
    auto ms = j.find("ms");
    if (items == j.end() || !items->is_array() || items->empty()) fail("\"items\" must be a non-empty array");
    if (ms == j.end() || !ms->is_number() || !(ms->get<double>() > 0)) fail("\"ms\" must be a number > 0");
    CostSample c;
    for (const auto& it : *items) {
      if (!it.is_array() || it.size() != 3 || !it[0].is_number_integer() || !it[1].is_number_integer() ||
          !it[2].is_number_integer() || it[0].get<int64_t>() < 0 || it[1].get<int64_t>() < 1 ||
          it[0].get<int64_t>() > INT32_MAX || it[1].get<int64_t>() > INT32_MAX)
        fail("each item must be [start_pos >= 0, num_tokens >= 1, sample 0|1]");
      c.shape.add(it[0].get<int32_t>(), it[1].get<int32_t>(), it[2].get<int64_t>() != 0);
    }
    c.ns = ms->get<double>() * 1e6;
    out.push_back(c);
  }
  return out;
}

void calibrate(CostProfile& p, const std::vector<CostSample>& served, const std::string& source) {
  if (served.size() < 10)
    throw std::invalid_argument("calibrate: " + std::to_string(served.size()) +
                                " served steps; at least 10 are needed");
  for (const CostSample& c : served)
    if (!(c.ns > 0) || !std::isfinite(c.ns) || c.shape.tokens < 1)
      throw std::invalid_argument("calibrate: a served step without tokens or a time > 0");
  auto samples = [&p](const std::vector<MeasuredStep>& points) {
    std::vector<CostSample> out;
    for (const MeasuredStep& m : points) {
      if (m.reps_ns.empty()) throw std::invalid_argument("calibrate: a point has no repetitions");
      out.push_back({m.sample.shape, rep_time(p.stat, m.reps_ns)});
    }
    return out;
  };
  const std::vector<CostSample> grid_points = samples(p.fit_points);
  // The grid's fit, as refit() makes it: what the served steps are measured
  // against, and what a second calibration starts from. A profile without
  // measured points (written by hand) has only its model.
  p.calibration.before =
      fit_error(grid_points.empty() ? p.cost : CostModel::fit(p.cost.knots, grid_points), served);
  std::vector<CostSample> all = grid_points;
  all.insert(all.end(), served.begin(), served.end());
  p.cost = CostModel::fit(p.cost.knots, all);
  // The fit follows the typical step (relative error); a served run's busy
  // time is the sum of its steps, slow tail included. Scale the model so
  // that it predicts that sum.
  double served_ns = 0, predicted_ns = 0;
  for (const CostSample& c : served) {
    served_ns += c.ns;
    predicted_ns += static_cast<double>(p.cost.predict_ns(c.shape));
  }
  if (predicted_ns > 0) {
    const double scale = served_ns / predicted_ns;
    for (double& k : p.cost.knot_ns) k *= scale;
    for (double* c : {&p.cost.sample_ns, &p.cost.decode_pair_ns, &p.cost.prefill_pair_ns, &p.cost.item_ns})
      *c *= scale;
  }
  p.calibration.after = fit_error(p.cost, served);
  // The profile's own errors now describe the calibrated model.
  if (!grid_points.empty()) p.fit_error = fit_error(p.cost, grid_points);
  if (!p.heldout_points.empty()) p.heldout_error = fit_error(p.cost, samples(p.heldout_points));
  p.calibration.steps = served.size();
  p.calibration.source = source;
}

void write_cost_profile(const std::string& path, const CostProfile& profile) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write cost profile '" + path + "'");
  out << profile.to_json().dump(1) << '\n';
  if (!out) throw std::runtime_error("error writing cost profile '" + path + "'");
}

CostProfile read_cost_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error("cannot read cost profile '" + path + "' (make one with `troupe profile`)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::runtime_error("cost profile '" + path + "' is not JSON: " + e.what());
  }
  try {
    return CostProfile::from_json(j);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

}  // namespace troupe::cluster::sim
