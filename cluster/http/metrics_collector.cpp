#include "cluster/http/metrics_collector.hpp"

#include <initializer_list>
#include <variant>

namespace troupe::cluster {
namespace {

// vLLM's buckets (vllm/v1/metrics/loggers.py), in seconds.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kTokenBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                           0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                             5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

constexpr const char* kP = "troupe:";

}  // namespace

MetricsCollector::MetricsCollector(const MetricsCollectorOptions& o)
    : options_(o),
      ttft_(kTtftBuckets),
      itl_(kTokenBuckets),
      tpot_(kTokenBuckets),
      e2e_(kRequestBuckets),
      queue_(kRequestBuckets),
      prefill_(kRequestBuckets),
      decode_(kRequestBuckets),
      inference_(kRequestBuckets),
      prompt_len_(buckets_1_2_5(o.max_model_len)),
      output_len_(buckets_1_2_5(o.max_model_len)) {}

void MetricsCollector::observe(const actors::Reply& reply, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, transport::Accepted>) {
          last_token_ns_[{reply.client, m.tag}] = 0;
        } else if constexpr (std::is_same_v<T, transport::Rejected>) {
          rejected_[transport::to_string(m.code)] += 1;
        } else if constexpr (std::is_same_v<T, transport::Tokens>) {
          auto it = last_token_ns_.find({reply.client, m.tag});
          if (it == last_token_ns_.end() || m.ids.empty()) return;
          if (it->second > 0) {
            // One gap per token; tokens that arrive together share it (the first takes it all).
            itl_.observe(static_cast<double>(now_ns - it->second) / 1e9);
            for (size_t i = 1; i < m.ids.size(); ++i) itl_.observe(0.0);
          }
          it->second = now_ns;
        } else if constexpr (std::is_same_v<T, transport::Finished>) {
          last_token_ns_.erase({reply.client, m.tag});
          finished_[core::to_string(m.finish_reason)] += 1;
          const transport::Timings& t = m.timings;
          const int32_t out = m.usage.completion_tokens;
          e2e_.observe(t.e2e_ms / 1e3);
          queue_.observe(t.queue_ms / 1e3);
          inference_.observe((t.e2e_ms - t.queue_ms) / 1e3);
          prompt_len_.observe(m.usage.prompt_tokens);
          output_len_.observe(out);
          if (out > 0) {
            ttft_.observe(t.ttft_ms / 1e3);
            prefill_.observe((t.ttft_ms - t.queue_ms) / 1e3);
            decode_.observe((t.e2e_ms - t.ttft_ms) / 1e3);
          }
          if (out > 1) tpot_.observe((t.e2e_ms - t.ttft_ms) / 1e3 / (out - 1));
        }
      },
      reply.message);
}

void MetricsCollector::forget(const actors::ClientId& client) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = last_token_ns_.lower_bound({client, 0});
  while (it != last_token_ns_.end() && it->first.first == client) {
    it = last_token_ns_.erase(it);
    finished_["cancelled"] += 1;  // the router cancels what a vanished client leaves
  }
}

size_t MetricsCollector::tracked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_token_ns_.size();
}

std::string MetricsCollector::render(const actors::StatusReport& st) const {
  const std::string P = kP;
  const Labels model{{"model_name", options_.model_name}};
  auto per_worker = [&](const core::WorkerStats& w) {
    Labels l = model;
    l.emplace_back("worker", std::to_string(w.id));
    return l;
  };
  PrometheusWriter out;
  const auto& workers = st.batcher.workers;

  out.family(P + "num_workers", "gauge", "Workers serving (ready or draining).");
  out.sample(P + "num_workers", model, static_cast<double>(workers.size()));
  out.family(P + "worker_info", "gauge", "Each worker's node, device and state (always 1).");
  for (const auto& w : workers) {
    Labels l = per_worker(w);
    l.emplace_back("node", w.node);
    l.emplace_back("device", w.device);
    l.emplace_back("state", w.state == core::WorkerState::kActive ? "ready" : "draining");
    out.sample(P + "worker_info", l, 1);
  }
  out.family(P + "num_requests_running", "gauge", "Number of requests in model execution batches.");
  for (const auto& w : workers)
    out.sample(P + "num_requests_running", per_worker(w), w.scheduler.num_running);
  out.family(P + "num_requests_waiting", "gauge", "Number of requests waiting to be processed, per worker.");
  for (const auto& w : workers)
    out.sample(P + "num_requests_waiting", per_worker(w), w.scheduler.num_waiting);
  out.family(P + "num_requests_unplaced", "gauge",
             "Requests waiting for any worker (none can take them yet).");
  out.sample(P + "num_requests_unplaced", model, st.batcher.unplaced);
  out.family(P + "kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  for (const auto& w : workers) {
    const double total = w.scheduler.blocks_used + w.scheduler.blocks_free;
    out.sample(P + "kv_cache_usage_perc", per_worker(w), total > 0 ? w.scheduler.blocks_used / total : 0.0);
  }
  out.family(P + "prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.");
  for (const auto& w : workers) {
    out.sample(P + "prefix_cache_queries_total", per_worker(w),
               static_cast<double>(w.scheduler.prefix_query_tokens));
  }
  out.family(P + "prefix_cache_hits_total", "counter",
             "Prefix cache hits, in terms of number of cached tokens.");
  for (const auto& w : workers) {
    out.sample(P + "prefix_cache_hits_total", per_worker(w),
               static_cast<double>(w.scheduler.prefix_hit_tokens));
  }
  out.family(P + "num_preemptions_total", "counter", "Cumulative number of preemptions from the scheduler.");
  for (const auto& w : workers) {
    out.sample(P + "num_preemptions_total", per_worker(w), static_cast<double>(w.scheduler.preemptions));
  }
  const core::BatcherCounters& faults = st.batcher.counters;
  out.family(
      P + "workers_left_total", "counter",
      "Workers the batcher let go other than by a drain, by reason (lost: no heartbeat or exited; hung: "
      "a step past its deadline; broken: a result that did not fit its plan).");
  for (const auto& [reason, n] : {std::pair<const char*, int64_t>{"lost", faults.workers_lost},
                                  {"hung", faults.workers_hung},
                                  {"broken", faults.workers_broken}}) {
    Labels l = model;
    l.emplace_back("reason", reason);
    out.sample(P + "workers_left_total", l, static_cast<double>(n));
  }
  out.family(P + "requests_moved_total", "counter", "Unfinished requests moved off a worker that left.");
  out.sample(P + "requests_moved_total", model, static_cast<double>(faults.requests_moved));
  out.family(P + "tokens_recomputed_total", "counter",
             "Tokens of moved requests whose KV was computed again on another worker.");
  out.sample(P + "tokens_recomputed_total", model, static_cast<double>(faults.tokens_recomputed));
  out.family(P + "prompt_tokens_total", "counter", "Number of prefill tokens processed (finished requests).");
  out.sample(P + "prompt_tokens_total", model, static_cast<double>(st.router.prompt_tokens));
  out.family(P + "generation_tokens_total", "counter", "Number of generation tokens processed.");
  out.sample(P + "generation_tokens_total", model, static_cast<double>(st.router.output_tokens));

  std::lock_guard<std::mutex> lock(mu_);
  // A counter family with one sample per reason (0 for reasons not seen yet, so every series exists).
  auto by_reason = [&](const std::string& name, const char* help, const char* label,
                       std::initializer_list<const char*> reasons,
                       const std::map<std::string, double>& counts) {
    out.family(P + name, "counter", help);
    for (const char* r : reasons) {
      Labels l = model;
      l.emplace_back(label, r);
      auto it = counts.find(r);
      out.sample(P + name, l, it == counts.end() ? 0.0 : it->second);
    }
  };
  by_reason("request_success_total", "Count of processed requests, by finish reason.", "finished_reason",
            {"eos", "length", "stop", "cancelled", "error"}, finished_);
  by_reason("request_rejected_total", "Requests refused at the door, by reason.", "reason",
            {"busy", "invalid", "too_long", "no_workers", "shutting_down"}, rejected_);
  const std::pair<const char*, std::pair<const Histogram*, const char*>> hists[] = {
      {"time_to_first_token_seconds", {&ttft_, "Histogram of time to first token in seconds."}},
      {"inter_token_latency_seconds", {&itl_, "Histogram of inter-token latency in seconds."}},
      {"request_time_per_output_token_seconds",
       {&tpot_, "Histogram of time_per_output_token_seconds per request."}},
      {"e2e_request_latency_seconds", {&e2e_, "Histogram of e2e request latency in seconds."}},
      {"request_queue_time_seconds", {&queue_, "Histogram of time spent in WAITING phase for request."}},
      {"request_inference_time_seconds",
       {&inference_, "Histogram of time spent in RUNNING phase for request."}},
      {"request_prefill_time_seconds", {&prefill_, "Histogram of time spent in PREFILL phase for request."}},
      {"request_decode_time_seconds", {&decode_, "Histogram of time spent in DECODE phase for request."}},
      {"request_prompt_tokens", {&prompt_len_, "Number of prefill tokens processed."}},
      {"request_generation_tokens", {&output_len_, "Number of generation tokens processed."}},
  };
  for (const auto& [name, h] : hists) {
    out.family(P + name, "histogram", h.second);
    out.histogram(P + name, model, *h.first);
  }
  return out.str();
}

}  // namespace troupe::cluster
