#pragma once
// Scoring token windows through a running server: each window is one job
// that asks for its prompt's logprobs and generates nothing, so a text's
// perplexity (`troupe perplexity --to / --base-url`) is computed by the
// cluster that serves it, batched with its other work. Two transports:
//   * troupe's own (ZeroMQ): submit {prompt_ids, max_tokens 0, prompt_logprobs 0};
//   * any OpenAI-compatible server: POST /v1/completions {prompt: ids,
//     echo: true, logprobs: 0, max_tokens: 0} (what lm-evaluation-harness
//     sends), reading choices[0].logprobs.token_logprobs.
// Jobs a busy server refuses are sent again later; any other failure fails
// the whole scoring with the server's reason.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cluster/client.hpp"

namespace troupe::cluster {

struct RemoteScoring {
  int32_t max_in_flight = 16;                    // windows in flight at once; >= 1
  std::chrono::seconds timeout{300};             // silence (ZeroMQ) or one request's time (HTTP) before failing
  std::function<void(int64_t, int64_t)> progress;  // (windows done, windows), optional
};

// For each window (>= 1 token), the logprob of each of its tokens after the
// first under the rest before it: out[w][i] scores windows[w][i + 1].
std::vector<std::vector<float>> score_windows(const ClientOptions& head, const std::vector<std::vector<int32_t>>& windows,
                                              const RemoteScoring& options);
std::vector<std::vector<float>> score_windows_http(const std::string& base_url, const std::string& api_key,
                                                   const std::string& model,
                                                   const std::vector<std::vector<int32_t>>& windows,
                                                   const RemoteScoring& options);

}  // namespace troupe::cluster
