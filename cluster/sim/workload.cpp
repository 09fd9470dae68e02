#include "cluster/sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "cluster/sim/parse_number.hpp"
#include "cluster/sim/random.hpp"
#include "core/splitmix.hpp"

namespace troupe::cluster::sim {
namespace {

constexpr double kNsPerS = 1e9;

double parse_double(const std::string& text, const std::string& spec) {
  const auto v = parse_number(text);
  if (!v) throw std::invalid_argument("length distribution '" + spec + "': '" + text + "' is not a number");
  return *v;
}

int32_t parse_length(const std::string& text, const std::string& spec) {
  const double v = parse_double(text, spec);
  if (v < 1 || v > std::numeric_limits<int32_t>::max() || std::floor(v) != v)
    throw std::invalid_argument("length distribution '" + spec + "': '" + text + "' is not a length >= 1");
  return static_cast<int32_t>(v);
}

std::vector<std::string> split(const std::string& s, char sep, size_t max_parts) {
  std::vector<std::string> parts;
  size_t from = 0;
  while (parts.size() + 1 < max_parts) {
    const size_t at = s.find(sep, from);
    if (at == std::string::npos) break;
    parts.push_back(s.substr(from, at - from));
    from = at + 1;
  }
  parts.push_back(s.substr(from));
  return parts;
}

std::vector<int32_t> read_lengths(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read length file '" + path + "'");
  std::vector<int32_t> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    const size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const std::string v = line.substr(b, e - b + 1);
    try {
      out.push_back(parse_length(v, "file:" + path));
    } catch (const std::invalid_argument&) {
      throw std::runtime_error(path + ":" + std::to_string(n) + ": '" + v + "' is not a length >= 1");
    }
  }
  if (out.empty()) throw std::runtime_error("length file '" + path + "' holds no lengths");
  return out;
}

void check(const LengthDistribution& d, const char* what) {
  auto bad = [&](const std::string& m) { throw std::invalid_argument(std::string(what) + " length: " + m); };
  if (d.kind == LengthKind::kFile) {
    if (d.samples.empty()) bad("the file gave no lengths");
    return;
  }
  if (d.mean < 1) bad("the mean must be >= 1");
  if (d.kind == LengthKind::kUniform && !(d.range_ratio >= 0 && d.range_ratio < 1))
    bad("the range ratio must lie in [0, 1)");
  if (d.kind == LengthKind::kLognormal && !(d.sigma > 0 && std::isfinite(d.sigma))) bad("sigma must be > 0");
}

int32_t draw(const LengthDistribution& d, Random& rng) {
  switch (d.kind) {
    case LengthKind::kFixed:
      return d.mean;
    case LengthKind::kUniform: {
      const auto lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(d.mean * (1 - d.range_ratio))));
      const auto hi = std::max<int64_t>(lo, static_cast<int64_t>(std::floor(d.mean * (1 + d.range_ratio))));
      return static_cast<int32_t>(rng.uniform_int(lo, hi));
    }
    case LengthKind::kLognormal: {
      // E[exp(N(mu, s^2))] = exp(mu + s^2/2): choose mu so the mean is d.mean.
      const double mu = std::log(static_cast<double>(d.mean)) - d.sigma * d.sigma / 2;
      const double v = std::round(rng.lognormal(mu, d.sigma));
      return static_cast<int32_t>(
          std::clamp(v, 1.0, static_cast<double>(std::numeric_limits<int32_t>::max())));
    }
    case LengthKind::kFile:
      return d.samples[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(d.samples.size()) - 1))];
  }
  return d.mean;
}

}  // namespace

LengthDistribution parse_length_distribution(const std::string& spec) {
  LengthDistribution d;
  const auto parts = split(spec, ':', 3);
  const std::string& kind = parts[0];
  auto need = [&](size_t n) {
    if (parts.size() != n)
      throw std::invalid_argument("length distribution '" + spec +
                                  "': expected LEN, fixed:LEN, uniform:LEN:RATIO, lognormal:LEN:SIGMA or "
                                  "file:PATH");
  };
  if (parts.size() == 1) {
    d.mean = parse_length(kind, spec);
  } else if (kind == "fixed") {
    need(2);
    d.mean = parse_length(parts[1], spec);
  } else if (kind == "uniform") {
    need(3);
    d.kind = LengthKind::kUniform;
    d.mean = parse_length(parts[1], spec);
    d.range_ratio = parse_double(parts[2], spec);
  } else if (kind == "lognormal") {
    need(3);
    d.kind = LengthKind::kLognormal;
    d.mean = parse_length(parts[1], spec);
    d.sigma = parse_double(parts[2], spec);
  } else if (kind == "file") {
    const std::string path = spec.substr(5);
    if (path.empty()) need(0);
    d.kind = LengthKind::kFile;
    d.origin = path;
    d.samples = read_lengths(path);
  } else {
    need(0);
  }
  check(d, "the");
  return d;
}

std::string to_string(const LengthDistribution& d) {
  auto num = [](double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  switch (d.kind) {
    case LengthKind::kFixed:
      return "fixed:" + std::to_string(d.mean);
    case LengthKind::kUniform:
      return "uniform:" + std::to_string(d.mean) + ":" + num(d.range_ratio);
    case LengthKind::kLognormal:
      return "lognormal:" + std::to_string(d.mean) + ":" + num(d.sigma);
    case LengthKind::kFile:
      return "file:" + d.origin;
  }
  return "?";
}

std::vector<WorkloadRequest> generate_synthetic(const SyntheticOptions& o) {
  if (o.num_requests < 1) throw std::invalid_argument("the number of requests must be >= 1");
  if (!(o.request_rate > 0)) throw std::invalid_argument("the request rate must be > 0 (inf = all at once)");
  if (!(o.burstiness > 0) || !std::isfinite(o.burstiness))
    throw std::invalid_argument("burstiness must be a positive number");
  check(o.input, "input");
  check(o.output, "output");
  // Separate streams: arrivals, input lengths, output lengths.
  Random arrivals(core::splitmix64(o.seed ^ 0xa441)), inputs(core::splitmix64(o.seed ^ 0x1e9)),
      outputs(core::splitmix64(o.seed ^ 0x0e7));
  const bool at_once = std::isinf(o.request_rate);
  const double scale = at_once ? 0 : 1.0 / (o.request_rate * o.burstiness);  // gamma scale, seconds
  std::vector<WorkloadRequest> out(static_cast<size_t>(o.num_requests));
  double t = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (i > 0 && !at_once) t += arrivals.gamma(o.burstiness, scale);
    out[i].arrival_ns = static_cast<int64_t>(std::llround(t * kNsPerS));
    out[i].input_len = draw(o.input, inputs);
    out[i].output_len = draw(o.output, outputs);
  }
  return out;
}

std::vector<WorkloadRequest> scale_arrivals(std::vector<WorkloadRequest> requests, double factor) {
  if (!(factor > 0) || !std::isfinite(factor)) throw std::invalid_argument("the time scale must be > 0");
  for (auto& r : requests) r.arrival_ns = static_cast<int64_t>(std::llround(r.arrival_ns * factor));
  return requests;
}

}  // namespace troupe::cluster::sim
