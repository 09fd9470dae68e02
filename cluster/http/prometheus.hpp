#pragma once
// Prometheus' text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/): a
// histogram with fixed buckets and a writer that puts each metric family's
// HELP and TYPE lines before its samples. Not thread-safe: the caller locks.
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace troupe::cluster {

using Labels = std::vector<std::pair<std::string, std::string>>;  // name, value (escaped on output)

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, finite and strictly increasing;
  // a +Inf bucket is implied. std::invalid_argument otherwise.
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations in each bucket (not cumulative), bounds().size() + 1 of them.
  const std::vector<uint64_t>& counts() const { return counts_; }
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value.
std::vector<double> buckets_1_2_5(int64_t max_value);

class PrometheusWriter {
 public:
  // Starts a family: `type` is counter, gauge or histogram; a counter's name
  // ends in _total. Its samples must follow before the next family.
  void family(const std::string& name, const std::string& type, const std::string& help);
  void sample(const std::string& name, const Labels& labels, double value);
  // name_bucket{le=...} (cumulative), name_sum, name_count.
  void histogram(const std::string& name, const Labels& labels, const Histogram& h);
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

// A number as the format writes it: +Inf, -Inf, NaN, integers without an exponent.
std::string format_value(double value);

}  // namespace troupe::cluster
