#pragma once
// ServingMetrics: what a load test or a simulation reports, defined exactly as
// vLLM's serving benchmark defines them (benchmarks/benchmark_serving.py,
// `vllm bench serve`), so troupe's numbers and JSON read like everyone else's:
//
//   TTFT  first streamed piece - start                 (one value per request)
//   TPOT  (E2EL - TTFT) / (output_tokens - 1)          (requests with >= 2 output tokens)
//   ITL   every gap between consecutive streamed pieces (all requests pooled)
//   E2EL  end - start                                  (one value per request)
//
// Each gets mean, median, population standard deviation and the chosen
// percentiles, in milliseconds. Percentiles use numpy's default ("linear"):
// on the sorted values x[0..n-1], p -> x[h] interpolated at h = (n-1)p/100.
// A metric with no values reports 0 everywhere (numpy on `values or 0`).
// Goodput counts requests that meet every given SLO (value <= target; a
// request with one output token has TPOT 0 for this purpose), per second.
//
// Torch-free and independent of who measured the times: `troupe bench` feeds
// client-side wall-clock times, `troupe simulate` virtual ones.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/token_times.hpp"

namespace troupe::core {

// One request as its client saw it. Times are nanoseconds on one clock for all
// requests of a run (any epoch).
struct RequestTiming {
  uint64_t id = 0;       // the caller's id (echoed in the JSON)
  int64_t start_ns = 0;  // sent by the client (arrival, for a simulation)
  TokenTimes token_ns;   // arrival of each streamed piece, in order (one per token
                         // when tokens stream one at a time); empty when none came
  int64_t end_ns = 0;    // response complete (>= the last piece)
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;  // generated tokens (a piece may carry several)
  bool success = true;        // false: error says why; the request counts as failed
  std::string error;
};

// One request's TTFT, TPOT and E2EL in seconds, as compute_serving_metrics
// takes them (TPOT 0 with fewer than 2 output tokens; TTFT 0 when no piece
// came). For plots of the distributions behind the summaries.
struct RequestLatency {
  double ttft_s = 0, tpot_s = 0, e2el_s = 0;
};
RequestLatency request_latency(const RequestTiming& request);

// Service-level objectives for goodput, in milliseconds; nullopt = not judged.
struct SloTargets {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};
// Parses vLLM's `--goodput` items: "ttft:500", "tpot:50", "e2el:2000" (ms, >= 0).
// Throws std::invalid_argument naming the bad item.
SloTargets parse_slo(const std::vector<std::string>& items);
// "ttft:500 tpot:50" (the form parse_slo reads); empty when no target is set.
std::string to_string(const SloTargets& slo);

struct LatencyStats {
  size_t count = 0;  // values summarised
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value), in MetricsOptions order
  // The value at percentile p when it was computed; throws std::out_of_range otherwise.
  double at(double p) const;
};

struct MetricsOptions {
  std::vector<double> percentiles = {90, 99};  // each in [0, 100]
  SloTargets slo;                              // empty: no goodput
};

struct ServingMetrics {
  double duration_s = 0;  // the run's length (the caller's: first send to last response)
  int32_t completed = 0;  // successful requests
  int32_t failed = 0;
  int64_t total_input_tokens = 0;         // prompts of the completed requests
  int64_t total_output_tokens = 0;        // outputs of the completed requests
  double request_throughput = 0;          // completed / duration_s
  std::optional<double> request_goodput;  // requests meeting every SLO / duration_s; nullopt without SLOs
  int32_t good_requests = 0;
  double output_throughput = 0;       // total_output_tokens / duration_s
  double total_token_throughput = 0;  // (input + output tokens) / duration_s
  LatencyStats ttft, tpot, itl, e2el;
  double max_output_tokens_per_s = 0;   // most pieces in one whole second since the first start
  int32_t max_concurrent_requests = 0;  // most requests between start and end at once
  std::vector<double> percentiles;      // those asked for, as in MetricsOptions
};

// How vLLM's keys spell a percentile: "99" for 99, "99.9" for 99.9 (p99.9_ttft_ms).
std::string percentile_word(double p);

// Numpy's default percentile of `values` (sorted in place); 0 when empty.
// p in [0, 100]; std::invalid_argument otherwise.
double percentile(std::vector<double>& values, double p);
// Mean, median, population std and percentiles of `values` (seconds) in ms.
LatencyStats summarize_ms(std::vector<double> values_s, const std::vector<double>& percentiles);

// duration_s > 0. Throws std::invalid_argument on a bad option or a request
// whose times run backwards (a piece before start, end before a piece).
ServingMetrics compute_serving_metrics(const std::vector<RequestTiming>& requests, double duration_s,
                                       const MetricsOptions& options = {});

struct ResultJsonOptions {
  bool itls = true;  // every request's inter-token gaps ("itls"); false keeps the file small on long runs
};
// vLLM's result JSON (duration, completed, failed, total_input_tokens,
// total_output_tokens, request_throughput, request_goodput (null without
// SLOs), output_throughput, total_token_throughput, max_output_tokens_per_s,
// max_concurrent_requests, {mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms;
// per request, in the order given: input_lens, output_lens, ttfts, itls,
// latencies, start_times, errors, all in seconds as vLLM writes them), plus
// troupe's "ids", "first_token_times" and "end_times" (seconds on the run's
// clock) and "goodput_slo". Key order is fixed, so equal inputs give equal bytes.
nlohmann::ordered_json to_result_json(const ServingMetrics& metrics,
                                      const std::vector<RequestTiming>& requests,
                                      const ResultJsonOptions& options = {});

// The human-readable block vLLM prints ("============ Serving Benchmark Result ============").
std::string format_summary(const ServingMetrics& metrics,
                           const std::string& title = "Serving Benchmark Result");

}  // namespace troupe::core
