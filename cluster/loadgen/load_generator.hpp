#pragma once
// The load generator behind `troupe bench`: sends a list of requests at
// their arrival times to a troupe head (ZeroMQ, transport/protocol.hpp) or
// to any OpenAI-compatible server (HTTP, streaming /v1/completions: troupe's
// HTTP front, llama.cpp's server, vLLM), and times every request at the
// client the way vLLM's serving benchmark does (benchmarks/backend_request_func.py):
//
//   start    just before the request is sent (after waiting for a
//            concurrency slot, as vLLM's semaphore does)
//   pieces   each streamed message that carries text (a chunk whose text is
//            empty, e.g. half a UTF-8 character, is not a piece)
//   end      the response is complete ([DONE], or troupe's `finished`)
//   tokens   the server's usage (completion_tokens); the request's max_tokens
//            when the server reports none
//
// core::compute_serving_metrics turns these into TTFT, TPOT, ITL, E2EL and
// throughput. Requests are greedy (temperature 0) with ignore_eos and
// max_tokens, so output lengths are forced and every server does the same work.
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/serving_metrics.hpp"
#include "transport/socket_options.hpp"

namespace troupe::cluster {

struct LoadRequest {
  int64_t arrival_ns = 0;             // due time from the run's start
  std::optional<std::string> prompt;  // text, or else
  std::vector<int32_t> prompt_ids;    // token ids
  int32_t prompt_tokens = 0;          // reported when the server gives no usage (ids: their count)
  int32_t max_tokens = 16;            // output tokens (forced: ignore_eos)
};

struct LoadProgress {
  size_t done = 0, total = 0, in_flight = 0;
  int64_t output_tokens = 0;  // pieces received so far
  double elapsed_s = 0;
};

struct LoadOptions {
  std::string to;        // a troupe head's client endpoint (tcp://HOST:5555), or else
  std::string base_url;  // an OpenAI-compatible server (http://HOST:PORT; a trailing /v1 is allowed)
  std::string model;     // HTTP: "model" in requests; "" = the first of GET /v1/models
  std::string api_key;   // HTTP: sent as a bearer token when non-empty
  std::optional<transport::CurveClientKeys> curve;  // ZeroMQ: CurveZMQ keys; nullopt = plaintext
  int32_t max_concurrency = 0;                      // requests in flight at most; 0 = no limit
  std::chrono::seconds timeout{600};                // a request silent this long fails
  // Called on the caller's thread about 5 times a second, and once at the end.
  std::function<void(const LoadProgress&)> on_progress;
};

struct LoadResult {
  std::vector<core::RequestTiming> requests;  // in the order given; ids 0..n-1; times from the run's start
  double duration_s = 0;                      // first send to last response
};

// Runs the whole list (sorted by arrival) and returns when every request has
// ended. std::invalid_argument for bad options, std::runtime_error when the
// server cannot be reached at all. A request that fails (an HTTP error, a
// rejection, a timeout) is recorded as failed with the reason; the run goes on.
LoadResult run_load(const std::vector<LoadRequest>& requests, const LoadOptions& options);

// vLLM's random dataset on troupe's one workload generator
// (cluster/sim/workload.hpp): gamma arrivals (shape = burstiness, mean gap
// 1/rate; rate infinity = all at 0), input and output lengths uniform in
// [L(1-r), L(1+r)], prompts of random token ids. Same options, same list.
struct RandomLoadOptions {
  int32_t num_requests = 100;                                     // >= 1
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; > 0
  double burstiness = 1.0;                                        // > 0; 1 = Poisson
  int32_t input_len = 1024, output_len = 128;                     // >= 1
  double range_ratio = 0;                                         // [0, 1)
  int32_t vocab_size = 50257;                                     // prompt ids in [0, vocab_size)
  uint64_t seed = 0;
};
std::vector<LoadRequest> random_load(const RandomLoadOptions& options);

// Arrival times (ns) for n requests of another source (a dataset file), from
// the same generator: the same seed, rate and burstiness give the same times.
std::vector<int64_t> load_arrivals(int32_t n, double request_rate, double burstiness, uint64_t seed);

}  // namespace troupe::cluster
