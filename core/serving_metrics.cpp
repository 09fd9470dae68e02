#include "core/serving_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace troupe::core {
namespace {

constexpr double kNsPerS = 1e9;

double seconds(int64_t ns) { return static_cast<double>(ns) / kNsPerS; }

double parse_ms(const std::string& item, const std::string& value) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || !std::isfinite(v) || v < 0) {
    throw std::invalid_argument("SLO '" + item +
                                "': the target must be a non-negative number of milliseconds");
  }
  return v;
}

void check_timing(const RequestTiming& r) {
  int64_t prev = r.start_ns;
  for (int64_t t : r.token_ns) {
    if (t < prev)
      throw std::invalid_argument("request " + std::to_string(r.id) + ": its token times run backwards");
    prev = t;
  }
  if (r.end_ns < prev)
    throw std::invalid_argument("request " + std::to_string(r.id) + ": it ends before its last token");
  if (r.prompt_tokens < 0 || r.output_tokens < 0)
    throw std::invalid_argument("request " + std::to_string(r.id) + ": negative token count");
}

void check_percentile(double p) {
  if (!(p >= 0 && p <= 100)) throw std::invalid_argument("percentile must lie in [0, 100]");
}

// Numpy's "linear" method on sorted, non-empty values.
double sorted_percentile(const std::vector<double>& values, double p) {
  const double h = (static_cast<double>(values.size()) - 1) * p / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (h - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

}  // namespace

std::string percentile_word(double p) {
  if (std::floor(p) == p) return std::to_string(static_cast<int64_t>(p));
  std::ostringstream os;
  os.precision(15);
  os << p;
  return os.str();
}

SloTargets parse_slo(const std::vector<std::string>& items) {
  SloTargets slo;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      throw std::invalid_argument("SLO '" + item +
                                  "' must be NAME:MILLISECONDS with NAME one of ttft, tpot, e2el");
    }
    const std::string name = item.substr(0, colon);
    const double v = parse_ms(item, item.substr(colon + 1));
    if (name == "ttft") {
      slo.ttft_ms = v;
    } else if (name == "tpot") {
      slo.tpot_ms = v;
    } else if (name == "e2el") {
      slo.e2el_ms = v;
    } else {
      throw std::invalid_argument("SLO '" + item + "': the name must be ttft, tpot or e2el");
    }
  }
  return slo;
}

std::string to_string(const SloTargets& slo) {
  std::ostringstream os;
  os.precision(15);
  const char* sep = "";
  auto put = [&](const char* name, const std::optional<double>& v) {
    if (!v) return;
    os << sep << name << ':' << *v;
    sep = " ";
  };
  put("ttft", slo.ttft_ms);
  put("tpot", slo.tpot_ms);
  put("e2el", slo.e2el_ms);
  return os.str();
}

double LatencyStats::at(double p) const {
  for (const auto& [q, v] : percentiles_ms)
    if (q == p) return v;
  throw std::out_of_range("percentile " + percentile_word(p) + " was not computed");
}

double percentile(std::vector<double>& values, double p) {
  check_percentile(p);
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return sorted_percentile(values, p);
}

LatencyStats summarize_ms(std::vector<double> v, const std::vector<double>& percentiles) {
  LatencyStats s;
  s.count = v.size();
  for (double p : percentiles) {
    check_percentile(p);
    s.percentiles_ms.emplace_back(p, 0.0);
  }
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  s.mean_ms = mean * 1000;
  s.std_ms = std::sqrt(sq / static_cast<double>(v.size())) * 1000;
  std::sort(v.begin(), v.end());
  s.median_ms = sorted_percentile(v, 50) * 1000;
  for (auto& [p, value] : s.percentiles_ms) value = sorted_percentile(v, p) * 1000;
  return s;
}

RequestLatency request_latency(const RequestTiming& r) {
  RequestLatency l;
  l.e2el_s = seconds(r.end_ns - r.start_ns);
  // No piece streamed (a non-streaming answer): vLLM leaves ttft at 0.
  l.ttft_s = r.token_ns.empty() ? 0.0 : seconds(r.token_ns.front() - r.start_ns);
  if (r.output_tokens > 1) l.tpot_s = (l.e2el_s - l.ttft_s) / (r.output_tokens - 1);
  return l;
}

ServingMetrics compute_serving_metrics(const std::vector<RequestTiming>& requests, double duration_s,
                                       const MetricsOptions& options) {
  if (!(duration_s > 0) || !std::isfinite(duration_s))
    throw std::invalid_argument("the run's duration must be a positive number of seconds");
  ServingMetrics m;
  m.duration_s = duration_s;
  m.percentiles = options.percentiles;
  std::vector<double> ttfts, tpots, itls, e2els;
  int64_t first_start = 0;
  bool any = false;
  for (const RequestTiming& r : requests) {
    check_timing(r);
    if (!r.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    const RequestLatency lat = request_latency(r);
    const double e2el = lat.e2el_s, ttft = lat.ttft_s, tpot = lat.tpot_s;
    if (r.output_tokens > 1) tpots.push_back(tpot);
    r.token_ns.for_each_gap([&](int64_t gap) { itls.push_back(seconds(gap)); });
    ttfts.push_back(ttft);
    e2els.push_back(e2el);
    if (!options.slo.empty()) {
      const bool good = (!options.slo.ttft_ms || ttft * 1000 <= *options.slo.ttft_ms) &&
                        (!options.slo.tpot_ms || tpot * 1000 <= *options.slo.tpot_ms) &&
                        (!options.slo.e2el_ms || e2el * 1000 <= *options.slo.e2el_ms);
      if (good) ++m.good_requests;
    }
    if (!any || r.start_ns < first_start) first_start = r.start_ns;
    any = true;
  }
  m.request_throughput = m.completed / duration_s;
  m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
  m.total_token_throughput = static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
  if (!options.slo.empty()) m.request_goodput = m.good_requests / duration_s;
  m.ttft = summarize_ms(std::move(ttfts), options.percentiles);
  m.tpot = summarize_ms(std::move(tpots), options.percentiles);
  m.itl = summarize_ms(std::move(itls), options.percentiles);
  m.e2el = summarize_ms(std::move(e2els), options.percentiles);

  // Peak pieces per whole second since the first start, and peak concurrency
  // over half-open [start, end) intervals (an end before a start at a tie).
  std::vector<int64_t> per_second;
  std::vector<std::pair<int64_t, int>> edges;
  for (const RequestTiming& r : requests) {
    if (!r.success) continue;
    for (int64_t t : r.token_ns) {
      const size_t b = static_cast<size_t>((t - first_start) / static_cast<int64_t>(kNsPerS));
      if (b >= per_second.size()) per_second.resize(b + 1, 0);
      ++per_second[b];
    }
    edges.emplace_back(r.start_ns, 1);
    edges.emplace_back(r.end_ns, -1);
  }
  for (int64_t n : per_second) m.max_output_tokens_per_s = std::max(m.max_output_tokens_per_s, double(n));
  std::sort(edges.begin(), edges.end());
  int32_t live = 0;
  for (const auto& e : edges) {
    live += e.second;
    m.max_concurrent_requests = std::max(m.max_concurrent_requests, live);
  }
  return m;
}

nlohmann::ordered_json to_result_json(const ServingMetrics& m, const std::vector<RequestTiming>& requests,
                                      const ResultJsonOptions& options) {
  using nlohmann::ordered_json;
  ordered_json j;
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = m.request_goodput ? ordered_json(*m.request_goodput) : ordered_json(nullptr);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  auto put = [&](const char* name, const LatencyStats& s) {
    j[std::string("mean_") + name + "_ms"] = s.mean_ms;
    j[std::string("median_") + name + "_ms"] = s.median_ms;
    j[std::string("std_") + name + "_ms"] = s.std_ms;
    for (const auto& [p, v] : s.percentiles_ms) j["p" + percentile_word(p) + "_" + name + "_ms"] = v;
  };
  put("ttft", m.ttft);
  put("tpot", m.tpot);
  put("itl", m.itl);
  put("e2el", m.e2el);

  ordered_json ids = ordered_json::array(), input_lens = ordered_json::array(),
               output_lens = ordered_json::array(), ttfts = ordered_json::array(),
               itls = ordered_json::array(), latencies = ordered_json::array(),
               start_times = ordered_json::array(), first_token_times = ordered_json::array(),
               end_times = ordered_json::array(), errors = ordered_json::array();
  for (const RequestTiming& r : requests) {
    ids.push_back(r.id);
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.success ? r.output_tokens : 0);
    ttfts.push_back(r.success && !r.token_ns.empty() ? seconds(r.token_ns.front() - r.start_ns) : 0.0);
    latencies.push_back(r.success ? seconds(r.end_ns - r.start_ns) : 0.0);
    start_times.push_back(seconds(r.start_ns));
    first_token_times.push_back(r.token_ns.empty() ? ordered_json(nullptr)
                                                   : ordered_json(seconds(r.token_ns.front())));
    end_times.push_back(seconds(r.end_ns));
    errors.push_back(r.error);
    if (options.itls) {
      ordered_json gaps = ordered_json::array();
      r.token_ns.for_each_gap([&](int64_t gap) { gaps.push_back(seconds(gap)); });
      itls.push_back(std::move(gaps));
    }
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  if (options.itls) j["itls"] = std::move(itls);
  j["latencies"] = std::move(latencies);
  j["start_times"] = std::move(start_times);
  j["errors"] = std::move(errors);
  j["ids"] = std::move(ids);
  j["first_token_times"] = std::move(first_token_times);
  j["end_times"] = std::move(end_times);
  return j;
}

std::string format_summary(const ServingMetrics& m, const std::string& title) {
  std::string out;
  char line[160];
  auto row = [&](const char* label, double v, bool integer = false) {
    if (integer) {
      std::snprintf(line, sizeof line, "%-40s %-10lld\n", label, static_cast<long long>(v));
    } else {
      std::snprintf(line, sizeof line, "%-40s %-10.2f\n", label, v);
    }
    out += line;
  };
  auto header = [&](const std::string& text, char fill) {
    const int pad = std::max(0, 50 - static_cast<int>(text.size()));
    out += std::string(pad / 2, fill) + text + std::string(pad - pad / 2, fill) + "\n";
  };
  header(" " + title + " ", '=');
  row("Successful requests:", m.completed, true);
  row("Failed requests:", m.failed, true);
  row("Benchmark duration (s):", m.duration_s);
  row("Total input tokens:", static_cast<double>(m.total_input_tokens), true);
  row("Total generated tokens:", static_cast<double>(m.total_output_tokens), true);
  row("Request throughput (req/s):", m.request_throughput);
  if (m.request_goodput) row("Request goodput (req/s):", *m.request_goodput);
  row("Output token throughput (tok/s):", m.output_throughput);
  row("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  row("Peak concurrent requests:", m.max_concurrent_requests, true);
  row("Total Token throughput (tok/s):", m.total_token_throughput);
  auto block = [&](const char* head, const char* name, const LatencyStats& s) {
    header(head, '-');
    row((std::string("Mean ") + name + " (ms):").c_str(), s.mean_ms);
    row((std::string("Median ") + name + " (ms):").c_str(), s.median_ms);
    for (const auto& [p, v] : s.percentiles_ms)
      row(("P" + percentile_word(p) + " " + name + " (ms):").c_str(), v);
  };
  block("Time to First Token", "TTFT", m.ttft);
  block("Time per Output Token (excl. 1st token)", "TPOT", m.tpot);
  block("Inter-token Latency", "ITL", m.itl);
  block("End-to-end Latency", "E2EL", m.e2el);
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace troupe::core
