#pragma once
// The HTTP front: an OpenAI-compatible server beside the ZeroMQ front, on the
// same router, on Boost.Beast and Boost.Asio: a few event-loop threads serve
// every connection, streams included (no thread per request or stream).
//
//   POST /v1/completions        jobs to the router; a JSON response, or
//                               Server-Sent Events (stream: true)
//   POST /v1/chat/completions   400: GPT-2 has no chat template
//   GET  /v1/models             the served model
//   GET  /health                200 once a worker has joined, 503 before
//   GET  /metrics               Prometheus text (cluster/http/metrics_collector.hpp)
//
// Limits come before reading: a connection's header must arrive whole
// within --http-header-timeout (408) and fit --http-max-header-bytes (431);
// the route and the API key are checked on the header alone (404, 401), and
// a declared body over --http-max-body-bytes is refused (413), all before a
// byte of the body is read; the body must arrive within --http-body-timeout
// (408). Past --http-max-connections a new connection gets a 503 with
// Retry-After and is closed, never queued. Requests pipelined on one
// connection are answered in order.
//
// Each HTTP request is a client of its own to the router,
// ClientId::http(a counter), so the head's sink sends its replies here.
// The sink posts a request's replies to its connection's strand. A client
// that goes away is noticed on the connection itself: a failed write, or a
// hang-up polled every 100 ms (a client that only half-closed is still
// answered), and its jobs are cancelled ("client gone": their KV is freed).
// docs/http.md has the details.
//
//   connection ──submit ×N──▶ router ──Accepted|Rejected──▶ strand: 4xx/5xx, or
//   connection ◀──Tokens, Finished── strand ◀── router      200 + JSON | SSE chunks, [DONE]
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/router_actor.hpp"

namespace troupe::model {
class Tokenizer;
}

namespace troupe::cluster {

class MetricsCollector;

struct HttpOptions {
  std::string listen;      // HOST:PORT ("127.0.0.1:8000", "[::1]:8000"); port 0 = any free port; "" = off
  std::string api_key;     // non-empty: /v1/* need "Authorization: Bearer <key>"
  bool insecure = false;   // allow a non-loopback bind without an api key
  int32_t threads = 2;     // event-loop threads
  std::string model_name;  // the served model's name ("model" in requests and responses)
  int32_t max_model_len = 1024;              // reported by /v1/models
  int32_t max_queue = 1024;                  // the router's: a request of more sequences could never start
  int32_t max_connections = 4096;            // open at once; past it 503 + Retry-After, then closed
  size_t max_header_bytes = 16384;           // a larger request line + header: 431
  size_t max_body_bytes = size_t{16} << 20;  // larger request bodies get 413 (before being read)
  int32_t header_timeout_s = 5;              // a header not whole after this: 408
  int32_t body_timeout_s = 30;               // a body not whole after this (from its header's end): 408
  int32_t keep_alive_s = 5;                  // an idle kept-alive connection is closed after this
  int32_t request_timeout_s =
      600;  // a non-streamed completion not done after this: 504, its jobs cancelled; 0 = none
};

// Throws std::invalid_argument (saying which flag to add) when `listen`
// is not loopback and there is neither an api key nor `insecure`. An api
// key authenticates but does not encrypt: put TLS in front for other hosts.
void check_http_bind_security(const std::string& listen, bool has_api_key, bool insecure);

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
