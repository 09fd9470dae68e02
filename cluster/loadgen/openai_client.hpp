#pragma once
// A client of OpenAI-compatible servers for the load generator: many
// streaming /v1/completions calls in flight on one thread (libcurl's multi
// interface over kept-alive connections), each one's Server-Sent Events read
// as they arrive.
//
// One thread, not one per stream: the client runs on the same CPUs as the
// server it measures, and a thread per stream wakes once per stream per
// decode step (16 wake-ups a step at 16 concurrent), each able to preempt one
// of the worker's compute threads; here a step's chunks are read in one or a
// few wake-ups, as the ZeroMQ client reads its socket.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::cluster {

// Server-Sent Events (WHATWG HTML, "server-sent events"): bytes in, the data
// of each complete event out. Lines are split at \n, \r\n or \r; "data:"
// lines of one event are joined with \n; comments (":...") and other fields
// are skipped; an event ends at a blank line.
class SseParser {
 public:
  std::vector<std::string> feed(const char* data, size_t size);

 private:
  std::string line_, data_;
  bool has_data_ = false, after_cr_ = false;
};

struct StreamedCompletion {
  int status = 0;               // HTTP status; 0 = no response (connection failed)
  std::string error;            // why it failed ("" = it succeeded)
  std::vector<int64_t> pieces;  // arrival (ns on the caller's clock) of each chunk with text
  std::string text;
  std::optional<int32_t> prompt_tokens, completion_tokens;  // the server's usage, when it gave one
  std::string finish_reason;
  int32_t retries = 0;  // sends repeated because the server had not answered at all
};

// The body of one streaming completion, fed as it arrives: OpenAI's chunks
// (text, finish_reason, usage, an error object), [DONE], or the error body
// of a non-200 answer. No I/O: the transfer is the caller's.
class CompletionStream {
 public:
  // `status`: the answer's HTTP status, known before its body.
  // Returns false to abandon the transfer (a chunk that is not JSON, or an
  // error body over 1 MiB). `t` stamps any piece; on_piece runs after each.
  bool feed(int status, const char* data, size_t n, int64_t t, const std::function<void()>& on_piece);
  // After the transfer; transport_error: "" when it completed. The status is
  // the one fed (0 when there was no answer).
  StreamedCompletion finish(int status, const std::string& transport_error);
  bool received_anything() const { return received_; }

 private:
  StreamedCompletion out_;
  SseParser parser_;
  std::string raw_;  // the body of a non-200 answer
  bool done_ = false, received_ = false;
};

struct StreamRequest {
  size_t id = 0;          // the caller's, handed back with the result
  nlohmann::json body;    // stream: true is the caller's
};

// Many streaming completions at once on the calling thread (libcurl multi).
// Not thread-safe: one thread adds, polls and collects.
class OpenAiStreams {
 public:
  // base_url: http[s]://HOST:PORT, optionally ending in /v1. `timeout`: a
  // stream silent this long fails. `now` stamps pieces; on_piece(id) runs
  // after each one.
  OpenAiStreams(const std::string& base_url, const std::string& api_key, std::chrono::seconds timeout,
                std::function<int64_t()> now, std::function<void(size_t)> on_piece = {});
  ~OpenAiStreams();
  OpenAiStreams(const OpenAiStreams&) = delete;
  OpenAiStreams& operator=(const OpenAiStreams&) = delete;

  // POSTs to /v1/completions; it is sent by the next poll().
  void add(StreamRequest request);
  // Moves every transfer on, waiting at most `wait` for something to read;
  // returns the requests that ended (succeeded or failed: never throws for
  // what the server does). A request the server never answered (a kept-alive
  // connection it had closed, a connect dropped from a full accept backlog)
  // is sent again, twice at most, its time still counting from the first.
  std::vector<std::pair<size_t, StreamedCompletion>> poll(std::chrono::milliseconds wait);
  size_t in_flight() const;

  struct Transfer;

 private:
  void start(std::unique_ptr<Transfer> t);
  std::string url_, api_key_;
  std::chrono::seconds timeout_;
  std::function<int64_t()> now_;
  std::function<void(size_t)> on_piece_;
  void* multi_ = nullptr;  // CURLM*
  std::vector<std::unique_ptr<Transfer>> transfers_;
};

// The ids of GET /v1/models; std::runtime_error when the server does not answer.
std::vector<std::string> list_models(const std::string& base_url, const std::string& api_key);
// One non-streaming POST /v1/completions of `body`; its JSON answer. Throws
// std::runtime_error naming the URL on a transport failure, a non-200 status
// (with the server's error message) or a body that is not JSON.
nlohmann::json post_completion(const std::string& base_url, const std::string& api_key, const nlohmann::json& body,
                               std::chrono::seconds timeout);

// "http://h:p/v1/" -> "http://h:p" (the origin the client speaks to).
std::string server_origin(const std::string& base_url);

}  // namespace troupe::cluster
