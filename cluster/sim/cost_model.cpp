#include "cluster/sim/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cluster/sim/least_squares.hpp"
#include "core/serving_metrics.hpp"

namespace troupe::cluster::sim {

void StepShape::add(int32_t start, int32_t n, bool sample) {
  tokens += n;
  ++items;
  sample_rows += sample ? 1 : 0;
  const auto s = static_cast<int64_t>(start), k = static_cast<int64_t>(n);
  if (n == 1) {
    decode_pairs += s + 1;
  } else {
    prefill_pairs += k * s + k * (k + 1) / 2;
  }
}

StepShape StepShape::of(const core::StepPlan& plan) {
  StepShape s;
  for (const auto& w : plan.work) {
    s.add(w.start_pos, w.num_tokens, w.sample);
    s.sample_rows += w.score_rows;  // prompt rows scored (prompt_logprobs): LM head rows as well
  }
  return s;
}

namespace {

// The hat functions of T at knots k that are not zero: weight w0 on knot i,
// w1 on knot i + 1 (w1 = 0 where T is at or below the first knot, or there
// is one knot only).
struct Segment {
  size_t i = 0;
  double w0 = 1, w1 = 0;
};

Segment segment(const std::vector<double>& k, double t) {
  Segment g;
  if (k.size() == 1 || t <= k.front()) return g;
  while (g.i + 2 < k.size() && t > k[g.i + 1]) ++g.i;
  // On [k_i, k_{i+1}] (or past the last knot, extrapolating the last segment).
  const double f = (t - k[g.i]) / (k[g.i + 1] - k[g.i]);
  g.w0 = 1 - f;
  g.w1 = f;
  return g;
}

}  // namespace

std::vector<double> CostModel::basis(const std::vector<double>& k, const StepShape& s) {
  std::vector<double> row(k.size() + 4, 0.0);
  const Segment g = segment(k, static_cast<double>(s.tokens));
  row[g.i] = g.w0;
  if (g.i + 1 < k.size()) row[g.i + 1] = g.w1;
  const size_t o = k.size();
  row[o] = s.sample_rows;
  row[o + 1] = static_cast<double>(s.decode_pairs);
  row[o + 2] = static_cast<double>(s.prefill_pairs);
  row[o + 3] = s.items;
  return row;
}

void CostModel::check() const {
  if (knots.empty() || knots.size() != knot_ns.size())
    throw std::invalid_argument("CostModel: knots and knot_ns must be non-empty and of equal length");
  if (!(knots[0] >= 1)) throw std::invalid_argument("CostModel: knots must start at >= 1 token");
  for (size_t i = 1; i < knots.size(); ++i)
    if (!(knots[i] > knots[i - 1])) throw std::invalid_argument("CostModel: knots must increase");
  for (double v : knot_ns)
    if (!std::isfinite(v) || v < 0)
      throw std::invalid_argument("CostModel: knot times must be finite and >= 0");
  for (double v : {sample_ns, decode_pair_ns, prefill_pair_ns, item_ns})
    if (!std::isfinite(v) || v < 0)
      throw std::invalid_argument("CostModel: coefficients must be finite and >= 0");
}

int64_t CostModel::predict_ns(const StepShape& s) const {
  if (s.tokens == 0) return 0;
  // basis()'s row times the coefficients, without building the row (once per
  // simulated step): its other knot weights are 0 and add nothing.
  const Segment g = segment(knots, static_cast<double>(s.tokens));
  double t = g.w0 * knot_ns[g.i];
  if (g.i + 1 < knots.size()) t += g.w1 * knot_ns[g.i + 1];
  t += static_cast<double>(s.sample_rows) * sample_ns + static_cast<double>(s.decode_pairs) * decode_pair_ns +
       static_cast<double>(s.prefill_pairs) * prefill_pair_ns + static_cast<double>(s.items) * item_ns;
  return std::max<int64_t>(1, std::llround(t));
}

CostModel CostModel::scaled(double factor) const {
  if (!std::isfinite(factor) || !(factor > 0))
    throw std::invalid_argument("CostModel: a scale factor must be finite and > 0, got " +
                                std::to_string(factor));
  CostModel m = *this;
  for (double& v : m.knot_ns) v *= factor;
  for (double* v : {&m.sample_ns, &m.decode_pair_ns, &m.prefill_pair_ns, &m.item_ns}) *v *= factor;
  m.check();  // an overflow to inf is refused here
  return m;
}

std::vector<double> CostModel::knots_up_to(int64_t largest) {
  std::vector<double> knots = {1};
  for (double k = 4; k < static_cast<double>(largest); k *= 4) knots.push_back(k);
  if (largest > 1) knots.push_back(static_cast<double>(largest));
  return knots;
}

CostModel CostModel::fit(const std::vector<double>& knots, const std::vector<CostSample>& samples) {
  CostModel m;
  m.knots = knots;
  m.knot_ns.assign(knots.size(), 0.0);
  m.check();
  if (samples.empty()) throw std::invalid_argument("CostModel::fit: no samples");
  Matrix a;
  std::vector<double> b;
  for (const CostSample& s : samples) {
    if (!(s.ns > 0) || s.shape.tokens < 1)
      throw std::invalid_argument("CostModel::fit: a sample with no time or tokens");
    auto row = basis(knots, s.shape);
    for (double& v : row) v /= s.ns;  // relative error: every point weighs alike
    a.push_back(std::move(row));
    b.push_back(1.0);
  }
  const auto x = nonnegative_least_squares(a, b);
  for (size_t i = 0; i < knots.size(); ++i) m.knot_ns[i] = x[i];
  const size_t o = knots.size();
  m.sample_ns = x[o];
  m.decode_pair_ns = x[o + 1];
  m.prefill_pair_ns = x[o + 2];
  m.item_ns = x[o + 3];
  return m;
}

nlohmann::json CostModel::to_json() const {
  return {{"kind", "piecewise-tokens+attention"},
          {"knots_tokens", knots},
          {"knot_ns", knot_ns},
          {"sample_row_ns", sample_ns},
          {"decode_pair_ns", decode_pair_ns},
          {"prefill_pair_ns", prefill_pair_ns},
          {"item_ns", item_ns}};
}

CostModel CostModel::from_json(const nlohmann::json& j) {
  auto get = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key))
      throw std::runtime_error(std::string("cost model: missing \"") + key + "\"");
    return j[key];
  };
  auto number = [&](const char* key) {
    const auto& v = get(key);
    if (!v.is_number()) throw std::runtime_error(std::string("cost model: \"") + key + "\" must be a number");
    return v.get<double>();
  };
  auto numbers = [&](const char* key) {
    const auto& v = get(key);
    std::vector<double> out;
    if (!v.is_array()) throw std::runtime_error(std::string("cost model: \"") + key + "\" must be an array");
    for (const auto& x : v) {
      if (!x.is_number())
        throw std::runtime_error(std::string("cost model: \"") + key + "\" must hold numbers");
      out.push_back(x.get<double>());
    }
    return out;
  };
  if (!get("kind").is_string() || get("kind") != "piecewise-tokens+attention")
    throw std::runtime_error("cost model: unknown \"kind\" (this troupe reads piecewise-tokens+attention)");
  CostModel m;
  m.knots = numbers("knots_tokens");
  m.knot_ns = numbers("knot_ns");
  m.sample_ns = number("sample_row_ns");
  m.decode_pair_ns = number("decode_pair_ns");
  m.prefill_pair_ns = number("prefill_pair_ns");
  m.item_ns = number("item_ns");
  try {
    m.check();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("cost model: ") + e.what());
  }
  return m;
}

FitError fit_error(const CostModel& model, const std::vector<CostSample>& samples) {
  FitError e;
  std::vector<double> rel;
  for (const CostSample& s : samples) {
    if (!(s.ns > 0)) continue;
    rel.push_back(100.0 * std::fabs(static_cast<double>(model.predict_ns(s.shape)) - s.ns) / s.ns);
  }
  e.points = rel.size();
  if (rel.empty()) return e;
  e.median_pct = core::percentile(rel, 50);
  e.p90_pct = core::percentile(rel, 90);
  e.max_pct = rel.back();  // sorted by percentile()
  return e;
}

}  // namespace troupe::cluster::sim
