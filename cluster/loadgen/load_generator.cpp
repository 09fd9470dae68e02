#include "cluster/loadgen/load_generator.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>
#include <stdexcept>

#include "cluster/client.hpp"
#include "cluster/loadgen/openai_client.hpp"
#include "cluster/sim/prompt_builder.hpp"
#include "cluster/sim/workload.hpp"

namespace troupe::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
constexpr auto kProgressEvery = std::chrono::milliseconds(200);
constexpr auto kTimeoutScanEvery = std::chrono::milliseconds(100);
// How long the last cancels may take to leave when the run ends (the head
// stops working for requests the run gave up on).
constexpr auto kCancelLinger = std::chrono::seconds(1);

// What both runners share: the list, the clock, the results, the progress.
struct Run {
  const std::vector<LoadRequest>& requests;
  const LoadOptions& options;
  std::vector<size_t> order;  // by arrival, stable
  Clock::time_point zero = Clock::now();
  std::vector<core::RequestTiming> out;
  size_t done = 0, in_flight = 0;  // (run_zmq: under its mutex)
  int64_t pieces = 0;
  Clock::time_point last_progress{};

  Run(const std::vector<LoadRequest>& r, const LoadOptions& o) : requests(r), options(o), out(r.size()) {
    order.resize(r.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return r[a].arrival_ns < r[b].arrival_ns; });
    for (size_t i = 0; i < r.size(); ++i) {
      out[i].id = i;
      out[i].prompt_tokens = r[i].prompt_tokens;
    }
  }
  int64_t now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - zero).count();
  }
  Clock::time_point due_at(size_t i) const { return zero + std::chrono::nanoseconds(requests[i].arrival_ns); }
  void progress(bool force = false) {
    if (!options.on_progress) return;
    const auto t = Clock::now();
    if (!force && t - last_progress < kProgressEvery) return;
    last_progress = t;
    options.on_progress(LoadProgress{done, requests.size(), in_flight, pieces, now() / 1e9});
  }
  void fail(size_t i, const std::string& why) {
    out[i].success = false;
    out[i].error = why;
    out[i].end_ns = std::max(now(), out[i].token_ns.empty() ? out[i].start_ns : out[i].token_ns.back());
  }
};

transport::Submit submit_of(const LoadRequest& r, uint64_t tag) {
  transport::Submit s;
  s.tag = tag;
  if (r.prompt) {
    s.prompt = r.prompt;
  } else {
    s.prompt_ids = r.prompt_ids;
  }
  s.max_tokens = r.max_tokens;
  s.temperature = 0;
  s.ignore_eos = true;
  return s;
}

// ZeroMQ: one client socket, every request in flight on it, told apart by tag
// (index + 1). The head's messages are handled on the client's socket thread
// as they come (ClientOptions::on_message); this thread sends the requests
// at their times and is woken only when one ends (a closed loop may send the
// next), not once per token, which cost a futex wake-up and two context
// switches a token. Both hold `mu` while they touch the run.
void run_zmq(Run& run) {
  const size_t n = run.requests.size();
  const size_t limit = run.options.max_concurrency > 0 ? static_cast<size_t>(run.options.max_concurrency) : n;
  std::vector<int64_t> last_heard(n, 0);
  std::vector<bool> open(n, false);
  std::mutex mu;
  std::condition_variable ended;  // a request ended
  auto end = [&](size_t i) {
    open[i] = false;
    --run.in_flight;
    ++run.done;
    ended.notify_one();  // (from the sending thread itself: nobody waits, nothing done)
  };
  const auto on_message = [&](transport::Message&& m) {
    const std::lock_guard<std::mutex> lock(mu);
    const int64_t now = run.now();
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, transport::Tokens> || std::is_same_v<T, transport::Finished> ||
                        std::is_same_v<T, transport::Rejected> || std::is_same_v<T, transport::Error>) {
            std::optional<uint64_t> tag = x.tag;
            if (!tag || *tag < 1 || *tag > n || !open[*tag - 1]) return;
            const size_t i = *tag - 1;
            core::RequestTiming& r = run.out[i];
            last_heard[i] = now;
            if constexpr (std::is_same_v<T, transport::Tokens> || std::is_same_v<T, transport::Finished>) {
              if (!x.text.empty()) {
                r.token_ns.push_back(now);
                ++run.pieces;
              }
            }
            if constexpr (std::is_same_v<T, transport::Finished>) {
              r.end_ns = now;
              r.prompt_tokens = x.usage.prompt_tokens;
              r.output_tokens = x.usage.completion_tokens;
              if (x.finish_reason == core::FinishReason::kError) run.fail(i, "error: " + x.error);
              end(i);
            } else if constexpr (std::is_same_v<T, transport::Rejected>) {
              run.fail(i, std::string("rejected (") + transport::to_string(x.code) + "): " + x.message);
              end(i);
            } else if constexpr (std::is_same_v<T, transport::Error>) {
              run.fail(i, std::string("error (") + transport::to_string(x.code) + "): " + x.message);
              end(i);
            }
          }
        },
        m);
  };
  ClientOptions co;
  co.endpoint = run.options.to;
  co.curve = run.options.curve;
  co.on_message = on_message;
  Client client(co);  // (after what on_message uses: its thread stops before they go)
  std::deque<size_t> due;
  size_t next = 0;
  int64_t next_scan_ns = 0;
  bool cancelled = false;  // a cancel was sent: it must leave before the client closes
  std::unique_lock<std::mutex> lock(mu);
  while (run.done < n) {
    const auto t = Clock::now();
    while (next < n && run.due_at(run.order[next]) <= t) due.push_back(run.order[next++]);
    while (!due.empty() && run.in_flight < limit) {
      const size_t i = due.front();
      due.pop_front();
      run.out[i].start_ns = run.now();
      last_heard[i] = run.out[i].start_ns;
      open[i] = true;
      ++run.in_flight;
      if (!client.send(submit_of(run.requests[i], i + 1))) {
        run.fail(i, "cannot send to " + run.options.to);
        end(i);
      }
    }
    auto wait = std::chrono::milliseconds(50);
    if (next < n && run.in_flight < limit) {
      const auto until =
          std::chrono::duration_cast<std::chrono::milliseconds>(run.due_at(run.order[next]) - t);
      wait = std::clamp(until, std::chrono::milliseconds(0), wait);
    }
    const size_t done_before = run.done;
    ended.wait_for(lock, wait, [&] { return run.done != done_before; });
    // The requests silent for longer than the timeout (seconds): a pass over
    // them every kTimeoutScanEvery.
    const int64_t now = run.now();
    if (now >= next_scan_ns) {
      next_scan_ns = now + std::chrono::nanoseconds(kTimeoutScanEvery).count();
      for (size_t i = 0; i < n; ++i) {
        if (open[i] && now - last_heard[i] > std::chrono::nanoseconds(run.options.timeout).count()) {
          cancelled = client.send(transport::Cancel{i + 1}) || cancelled;
          run.fail(i, "no answer for " + std::to_string(run.options.timeout.count()) + " s");
          end(i);
        }
      }
    }
    run.progress();
  }
  lock.unlock();
  if (cancelled) client.flush(kCancelLinger);
}

// HTTP: every request in flight on this one thread (libcurl multi), each on
// a kept-alive connection of its own; requests are released at their times.
void run_http(Run& run) {
  const size_t n = run.requests.size();
  std::string model = run.options.model;
  if (model.empty()) {
    const auto ids = list_models(run.options.base_url, run.options.api_key);
    if (ids.empty()) throw std::runtime_error("GET /v1/models named no model: give --model");
    model = ids[0];
  }
  // At most 1024 connections open at once, whatever the concurrency asked.
  const size_t limit = run.options.max_concurrency > 0
                           ? std::min(n, static_cast<size_t>(run.options.max_concurrency))
                           : std::min<size_t>(n, 1024);
  OpenAiStreams streams(
      run.options.base_url, run.options.api_key, run.options.timeout, [&] { return run.now(); },
      [&](size_t) { ++run.pieces; });
  std::deque<size_t> due;
  size_t next = 0;
  while (run.done < n) {
    const auto t = Clock::now();
    while (next < n && run.due_at(run.order[next]) <= t) due.push_back(run.order[next++]);
    while (!due.empty() && run.in_flight < limit) {
      const size_t i = due.front();
      due.pop_front();
      const LoadRequest& q = run.requests[i];
      json body{{"model", model},     {"max_tokens", q.max_tokens},
                {"temperature", 0.0}, {"ignore_eos", true},
                {"stream", true},     {"stream_options", {{"include_usage", true}}}};
      if (q.prompt) {
        body["prompt"] = *q.prompt;
      } else {
        body["prompt"] = q.prompt_ids;
      }
      ++run.in_flight;
      run.out[i].start_ns = run.now();
      streams.add({i, std::move(body)});
    }
    auto wait = std::chrono::milliseconds(50);
    if (next < n && run.in_flight < limit) {
      const auto until =
          std::chrono::duration_cast<std::chrono::milliseconds>(run.due_at(run.order[next]) - t);
      wait = std::clamp(until, std::chrono::milliseconds(0), wait);
    }
    for (auto& [i, c] : streams.poll(wait)) {
      core::RequestTiming& r = run.out[i];
      const LoadRequest& q = run.requests[i];
      r.end_ns = run.now();
      r.token_ns = core::TokenTimes(c.pieces);
      if (c.prompt_tokens) r.prompt_tokens = *c.prompt_tokens;
      r.output_tokens = c.completion_tokens ? *c.completion_tokens : q.max_tokens;
      if (!c.error.empty()) {
        r.success = false;
        r.error = c.error;
      }
      --run.in_flight;
      ++run.done;
    }
    run.progress();
  }
}

}  // namespace

LoadResult run_load(const std::vector<LoadRequest>& requests, const LoadOptions& options) {
  if (options.to.empty() == options.base_url.empty()) {
    throw std::invalid_argument(
        "give exactly one of --to (a troupe head) or --base-url (an OpenAI-compatible server)");
  }
  if (options.max_concurrency < 0) throw std::invalid_argument("--max-concurrency must be >= 0");
  if (!options.base_url.empty()) server_origin(options.base_url);  // checks it
  Run run(requests, options);
  if (!requests.empty()) {
    if (options.to.empty()) {
      run_http(run);
    } else {
      run_zmq(run);
    }
  }
  run.progress(true);
  LoadResult result;
  result.requests = std::move(run.out);
  int64_t first = INT64_MAX, last = 0;
  for (const auto& r : result.requests) {
    first = std::min(first, r.start_ns);
    last = std::max(last, r.end_ns);
  }
  result.duration_s = result.requests.empty() ? 0.0 : std::max(1e-9, (last - first) / 1e9);
  return result;
}

std::vector<LoadRequest> random_load(const RandomLoadOptions& o) {
  sim::SyntheticOptions s;
  s.num_requests = o.num_requests;
  s.request_rate = o.request_rate;
  s.burstiness = o.burstiness;
  s.seed = o.seed;
  for (auto* d : {&s.input, &s.output}) {
    d->kind = o.range_ratio > 0 ? sim::LengthKind::kUniform : sim::LengthKind::kFixed;
    d->range_ratio = o.range_ratio;
  }
  s.input.mean = o.input_len;
  s.output.mean = o.output_len;
  const std::vector<sim::WorkloadRequest> w = sim::generate_synthetic(s);
  sim::PromptOptions po;
  po.vocab_size = o.vocab_size;
  po.seed = o.seed;
  std::vector<LoadRequest> out;
  out.reserve(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    LoadRequest r;
    r.arrival_ns = w[i].arrival_ns;
    r.prompt_ids = sim::build_prompt(w[i], i, po);
    r.prompt_tokens = w[i].input_len;
    r.max_tokens = w[i].output_len;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<int64_t> load_arrivals(int32_t n, double request_rate, double burstiness, uint64_t seed) {
  sim::SyntheticOptions s;
  s.num_requests = n;
  s.request_rate = request_rate;
  s.burstiness = burstiness;
  s.seed = seed;
  std::vector<int64_t> out;
  for (const auto& r : sim::generate_synthetic(s)) out.push_back(r.arrival_ns);
  return out;
}

}  // namespace troupe::cluster
