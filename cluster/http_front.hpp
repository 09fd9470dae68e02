#pragma once
// The HTTP front: an OpenAI-compatible server (cpp-httplib, the library
// llama.cpp's server uses) beside the ZeroMQ front, on the same router.
//
//   POST /v1/completions        jobs to the router; a JSON response, or
//                               Server-Sent Events (stream: true)
//   POST /v1/chat/completions   400: GPT-2 has no chat template
//   GET  /v1/models             the served model
//   GET  /health                200 once a worker has joined, 503 before
//   GET  /metrics               Prometheus text (cluster/metrics_collector.hpp)
//
// Each HTTP request is a client of its own to the router, "h" + a counter,
// so the head's sink can tell its replies from the ZeroMQ front's ("z...").
// A request's handler runs on one of the server's threads and waits on a
// mailbox that the router's sink fills; a streaming client that goes away is
// noticed at the next write or within 100 ms of silence, and its jobs are
// cancelled ("client gone": their KV is freed). docs/http.md has the details.
//
//   handler ──submit ×N──▶ router ──Accepted|Rejected──▶ mailbox ──▶ handler: 4xx/5xx, or
//   handler ◀──Tokens, Finished── mailbox ◀── router        200 + JSON | SSE chunks, [DONE]
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/router_actor.hpp"

namespace troupe::model {
class Tokenizer;
}

namespace httplib {
class Server;
}

namespace troupe::cluster {

class MetricsCollector;

struct HttpOptions {
  std::string listen;      // HOST:PORT ("127.0.0.1:8000", "[::1]:8000"); port 0 = any free port; "" = off
  std::string api_key;     // non-empty: /v1/* need "Authorization: Bearer <key>"
  bool insecure = false;   // allow a non-loopback bind without an api key
  int32_t threads = 128;   // connections served at once (more wait to be accepted); >= 4
  std::string model_name;  // the served model's name ("model" in requests and responses)
  int32_t max_model_len = 1024;              // reported by /v1/models
  int32_t max_queue = 1024;                  // the router's: a request of more sequences could never start
  size_t max_body_bytes = size_t{16} << 20;  // larger request bodies get 413
  int32_t keep_alive_s = 2;                  // an idle kept-alive connection is closed after this
  int32_t request_timeout_s =
      600;  // a non-streamed completion not done after this: 504, its jobs cancelled; 0 = none
};

// Throws std::invalid_argument (saying which flag to add) when `listen`
// is not loopback and there is neither an api key nor `insecure`. An api
// key authenticates but does not encrypt: put TLS in front for other hosts.
void check_http_bind_security(const std::string& listen, bool has_api_key, bool insecure);

// Debian's cpp-httplib is a compiled library (libcpp-httplib.so) that
// listens with an accept backlog of 5 whatever CPPHTTPLIB_LISTEN_BACKLOG says
// where it is included, and sets SO_REUSEPORT, so a second server on the same
// port would bind too and take half of the connections. A burst of connects
// (a client opening 16 streams at once) overflows 5: the kernel drops the
// handshakes' last ACKs and the clients wait 1 s for a retransmission. This
// sets SO_REUSEADDR alone (a port in use is an error; a restart is not), and
// after_bind() raises the bound socket's backlog (listen again: Linux
// updates the queue's length).
class ListenBacklog {
 public:
  // Before binding `server`.
  explicit ListenBacklog(httplib::Server& server, int backlog = 1024);
  // After a successful bind; std::runtime_error if the socket is unknown or
  // listen() fails.
  void after_bind() const;

 private:
  std::shared_ptr<int> fd_;
  int backlog_;
};

class HttpFront {
 public:
  // `tokenizer` (token strings of logprobs) must outlive the front; the
  // collector is shared with the head's sink.
  HttpFront(const HttpOptions& options, const model::Tokenizer& tokenizer,
            std::shared_ptr<MetricsCollector> metrics);
  ~HttpFront();  // stop()
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  // Delivers the router's replies to "h..." clients; thread-safe, and
  // harmless after stop() or the front's end (replies are dropped).
  actors::ClientSink sink() const;
  // Binds the address (connections wait until start). std::invalid_argument
  // for a bad address, std::runtime_error when it cannot bind.
  void bind();
  // Serves on the front's own threads, sending jobs to `router`.
  void start(actors::router_actor router);
  // "HOST:PORT" as bound (the real port when 0 was asked).
  std::string endpoint() const;
  // Stops accepting, ends open streams (their jobs are cancelled) and joins.
  void stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace troupe::cluster
