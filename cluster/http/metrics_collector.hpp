#pragma once
// MetricsCollector: what `GET /metrics` shows, in Prometheus' text format,
// with vLLM's metric names (prefixed troupe: instead of vllm:) and buckets,
// so dashboards written for vLLM read troupe by changing the prefix.
//
// Two sources, both the head's own: every reply the router sends to any
// client (observe(): per-request timings measured by the router - queue,
// TTFT, end-to-end - and the time between a request's token messages), and
// the router's and batcher's counters at scrape time (render(): requests
// running and waiting, KV use, prefix-cache queries and hits, preemptions,
// per worker; prompt and generation tokens). docs/http.md lists every metric.
//
// Thread-safe: observe() runs on the router's thread, render() on an HTTP
// thread.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "actors/router/router_core.hpp"
#include "cluster/http/prometheus.hpp"

namespace troupe::cluster {

struct MetricsCollectorOptions {
  std::string model_name = "gpt2";  // the model_name label of every series
  int32_t max_model_len = 1024;     // top of the token-count histograms' buckets
};

class MetricsCollector {
 public:
  explicit MetricsCollector(const MetricsCollectorOptions& options);

  // One reply of the router, as it leaves; now_ns on a steady clock.
  void observe(const actors::Reply& reply, int64_t now_ns);
  // The client is gone (its jobs end without a Finished): forget its
  // requests, counted as finished with reason "cancelled".
  void forget(const actors::ClientId& client);
  // The whole exposition: what was observed, and `status`'s gauges and counters.
  std::string render(const actors::StatusReport& status) const;

  size_t tracked() const;  // requests between Accepted and their end (tests)

 private:
  MetricsCollectorOptions options_;
  mutable std::mutex mu_;
  std::map<std::pair<actors::ClientId, uint64_t>, int64_t> last_token_ns_;  // (client, tag) -> 0 = no token yet
  std::map<std::string, double> finished_, rejected_;                  // by reason
  Histogram ttft_, itl_, tpot_, e2e_, queue_, prefill_, decode_, inference_, prompt_len_, output_len_;
};

}  // namespace troupe::cluster
