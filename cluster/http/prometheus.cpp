#include "cluster/http/prometheus.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace troupe::cluster {
namespace {

// Label values escape backslash, double quote and newline; HELP text
// backslash and newline.
std::string escape(const std::string& s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

void write_labels(std::ostringstream& out, const Labels& labels) {
  if (labels.empty()) return;
  out << '{';
  for (size_t i = 0; i < labels.size(); ++i) {
    out << (i ? "," : "") << labels[i].first << "=\"" << escape(labels[i].second, true) << '"';
  }
  out << '}';
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      throw std::invalid_argument("Histogram: bounds must be finite and strictly increasing");
    }
  }
}

void Histogram::observe(double value) {
  // Prometheus buckets are inclusive: le = "upper bound".
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[i];
  sum_ += value;
  ++count_;
}

std::vector<double> buckets_1_2_5(int64_t max_value) {
  std::vector<double> out;
  for (int64_t scale = 1; scale <= max_value && scale <= (INT64_MAX / 10); scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale <= max_value) out.push_back(static_cast<double>(m * scale));
    }
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  char buf[32];
  for (int digits : {15, 16, 17}) {  // the shortest that reads back as v
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void PrometheusWriter::family(const std::string& name, const std::string& type, const std::string& help) {
  out_ << "# HELP " << name << ' ' << escape(help, false) << "\n# TYPE " << name << ' ' << type << '\n';
}

void PrometheusWriter::sample(const std::string& name, const Labels& labels, double value) {
  out_ << name;
  write_labels(out_, labels);
  out_ << ' ' << format_value(value) << '\n';
}

void PrometheusWriter::histogram(const std::string& name, const Labels& labels, const Histogram& h) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= h.bounds().size(); ++i) {
    cumulative += h.counts()[i];
    Labels l = labels;
    l.emplace_back("le", i < h.bounds().size() ? format_value(h.bounds()[i]) : "+Inf");
    sample(name + "_bucket", l, static_cast<double>(cumulative));
  }
  sample(name + "_sum", labels, h.sum());
  sample(name + "_count", labels, static_cast<double>(h.count()));
}

}  // namespace troupe::cluster
