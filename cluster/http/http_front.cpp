#include "cluster/http/http_front.hpp"

#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <functional>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cluster/http/metrics_collector.hpp"
#include "cluster/http/openai_api.hpp"
#include "core/splitmix.hpp"
#include "transport/endpoint_policy.hpp"

namespace troupe::cluster {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using openai::ApiError;
using Headers = std::vector<std::pair<std::string, std::string>>;

// How often a request in progress looks for its client hanging up.
constexpr std::chrono::milliseconds kWatchEvery{100};
// A stream whose client reads slower than it is written: cut past this backlog.
constexpr size_t kMaxStreamBacklog = size_t{4} << 20;
// How long a connection closed with its client still sending is drained
// (read and discarded) so that the client reads our answer before a reset.
constexpr std::chrono::seconds kLingerFor{2};

// An HTTP request's number (its ClientId) -> where its replies go. The sink (router's thread) calls the
// listener under the lock, so that after clear() nothing is posted any more.
struct Registry {
  using Listener = std::function<void(actors::ClientMessage&&)>;
  std::mutex mu;
  std::unordered_map<uint64_t, Listener> listeners;

  void deliver(const actors::Reply& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.client.front != actors::Front::kHttp) return;
    auto it = listeners.find(r.client.number);
    if (it == listeners.end()) return;  // the request is over: nobody listens
    actors::ClientMessage m = r.message;
    it->second(std::move(m));
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu);
    listeners.clear();
  }
  bool empty() {
    std::lock_guard<std::mutex> lock(mu);
    return listeners.empty();
  }
};

// host:port -> (host, port); "[v6]:port" too.
std::pair<std::string, int> split_host_port(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) {
    throw std::invalid_argument("--http '" + listen + "': expected HOST:PORT, e.g. 127.0.0.1:8000");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) throw std::invalid_argument("--http '" + listen + "': the host is missing");
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(listen.substr(colon + 1), &used);
    if (used != listen.size() - colon - 1) throw std::invalid_argument("junk");
  } catch (const std::exception&) {
    throw std::invalid_argument("--http '" + listen + "': the port is not a number");
  }
  if (port < 0 || port > 65535)
    throw std::invalid_argument("--http '" + listen + "': the port is out of range");
  return {host, port};
}

// Compares without an early exit, so timing does not reveal how much of
// the key was right (only its length).
bool same_secret(const std::string& given, const std::string& key) {
  unsigned char diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < given.size() && i < key.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  }
  return diff == 0;
}

std::string reason_phrase(int status) {
  if (status == 499) return "Client Closed Request";
  const auto s = http::int_to_status(static_cast<unsigned>(status));
  if (s == http::status::unknown) return "Unknown";
  const auto r = http::obsolete_reason(s);
  return std::string(r.data(), r.size());
}

// A response's status line and headers, through the blank line.
std::string response_head(int status, unsigned version, const Headers& headers) {
  std::string out = (version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ") + std::to_string(status) + " " +
                    reason_phrase(status) + "\r\nServer: troupe\r\n";
  for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
  return out + "\r\n";
}

// A whole response: status line, headers, body.
std::string response_bytes(int status, const std::string& content_type, const std::string& body, bool close,
                           unsigned version, const Headers& extra = {}) {
  Headers headers;
  if (!content_type.empty()) headers.emplace_back("Content-Type", content_type);
  headers.emplace_back("Content-Length", std::to_string(body.size()));
  headers.insert(headers.end(), extra.begin(), extra.end());
  if (close) {
    headers.emplace_back("Connection", "close");
  } else if (version == 10) {
    headers.emplace_back("Connection", "keep-alive");
  }
  return response_head(status, version, headers) + body;
}

// Whether a read's error means only that the client went away (or the read
// was cancelled): nothing to answer.
bool client_went_away(const error_code& ec) {
  return ec == http::error::end_of_stream || ec == http::error::partial_message || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::operation_aborted;
}

std::string sse(const json& j) { return "data: " + openai::dump(j) + "\n\n"; }

std::string hex(size_t n) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%zx", n);
  return buf;
}

enum class Route { kCompletions, kChat, kModels, kHealth, kMetrics, kNone };

Route route_of(http::verb method, std::string path) {
  path = path.substr(0, path.find('?'));
  if (method == http::verb::post && path == "/v1/completions") return Route::kCompletions;
  if (method == http::verb::post && path == "/v1/chat/completions") return Route::kChat;
  if (method == http::verb::get && path == "/v1/models") return Route::kModels;
  if (method == http::verb::get && path == "/health") return Route::kHealth;
  if (method == http::verb::get && path == "/metrics") return Route::kMetrics;
  return Route::kNone;
}

bool needs_key(Route r) { return r == Route::kCompletions || r == Route::kChat || r == Route::kModels; }

// Raises this process's soft limit on open files to its hard limit: every
// connection is a descriptor. Returns the soft limit now in force.
rlim_t raise_file_limit() {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0) return 1024;
  if (l.rlim_cur < l.rlim_max) {
    rlimit want = l;
    want.rlim_cur = l.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : l.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0) l = want;
  }
  return l.rlim_cur;
}

class Connection;

}  // namespace

void check_http_bind_security(const std::string& listen, bool has_api_key, bool insecure) {
  const auto [host, port] = split_host_port(listen);
  (void)port;
  if (has_api_key || insecure) return;
  const std::string as_zmq =
      "tcp://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":1";
  if (!transport::is_local_endpoint(as_zmq)) {
    throw std::invalid_argument("--http " + listen +
                                " is reachable from other hosts: give --api-key KEY (clients then send "
                                "'Authorization: Bearer KEY'; put TLS in front, the key is not encryption) "
                                "or --insecure");
  }
}

struct HttpFront::Impl {
  HttpOptions options;
  const model::Tokenizer& tokenizer;
  std::shared_ptr<MetricsCollector> metrics;
  std::shared_ptr<Registry> registry = std::make_shared<Registry>();
  actors::router_actor router;
  std::optional<asio::io_context> ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> accept_pause;  // after a failed accept (out of descriptors)
  std::vector<std::thread> threads;
  std::string endpoint;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_client{1};
  std::atomic<int32_t> open_connections{0};
  std::atomic<int32_t> refusing{0};  // connections being answered 503 past the limit
  std::mutex connections_mu;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;
  uint64_t id_base = 0;
  int64_t started_unix = 0;
  std::mutex workers_mu;
  int32_t known_workers = 0;
  bool known_draining = false;  // the router refuses new jobs (SIGTERM)
  // "" when the router and the batcher answered the last status; else which did not.
  std::string known_silent;
  Clock::time_point known_at{};

  Impl(const HttpOptions& o, const model::Tokenizer& t, std::shared_ptr<MetricsCollector> m)
      : options(o), tokenizer(t), metrics(std::move(m)) {
    id_base = std::random_device{}();
    id_base = id_base << 32 | std::random_device{}();
    started_unix = static_cast<int64_t>(std::time(nullptr));
  }

  // One router client (ClientId::http(a counter)) whose replies go to `listener` for
  // as long as the session lives; jobs left open are cancelled ("gone") at its end.
  struct Session {
    Impl& front;
    actors::ClientId client;
    bool jobs_open = false;

    Session(Impl& f, Registry::Listener listener) : front(f), client(actors::ClientId::http(f.next_client++)) {
      std::lock_guard<std::mutex> lock(front.registry->mu);
      front.registry->listeners.emplace(client.number, std::move(listener));
    }
    ~Session() {
      {
        std::lock_guard<std::mutex> lock(front.registry->mu);
        front.registry->listeners.erase(client.number);
      }
      if (jobs_open) {
        caf::anon_send(front.router, actors::gone_atom::value, client);
        front.metrics->forget(client);
      }
    }
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
  };

  // Workers the router knew of at the last status, when that is under a
  // second old, non-zero and both the router and the batcher answered;
  // else nullopt: ask again.
  std::optional<int32_t> cached_workers() {
    std::lock_guard<std::mutex> lock(workers_mu);
    if (known_workers > 0 && known_silent.empty() && Clock::now() - known_at < std::chrono::seconds(1))
      return known_workers;
    return std::nullopt;
  }
  // Takes a status (nullopt: the router did not answer); the workers it counts.
  int32_t note_status(const std::optional<actors::StatusReport>& st) {
    std::lock_guard<std::mutex> lock(workers_mu);
    known_workers = st ? st->router.workers : 0;
    known_draining = st && st->router.shutting_down;
    known_silent = !st                     ? "the router is not answering"
                   : !st->batcher.answered ? "the batcher is not answering"
                                           : "";
    known_at = Clock::now();
    return known_workers;
  }
  std::string silent() {
    std::lock_guard<std::mutex> lock(workers_mu);
    return known_silent;
  }
  bool draining() {
    std::lock_guard<std::mutex> lock(workers_mu);
    return known_draining || stopping;
  }

  bool authorized(const std::string& authorization) const {
    if (options.api_key.empty()) return true;
    const std::string prefix = "Bearer ";
    return authorization.compare(0, prefix.size(), prefix) == 0 &&
           same_secret(authorization.substr(prefix.size()), options.api_key);
  }

  std::string new_id() {
    static std::atomic<uint64_t> counter{0};
    char buf[40];
    std::snprintf(buf, sizeof buf, "cmpl-%016llx",
                  static_cast<unsigned long long>(core::splitmix64(id_base ^ counter++)));
    return buf;
  }

  void accept();
};

namespace {

using Impl = HttpFront::Impl;

// One client connection, on its own strand. Requests are read one at a
// time, the next only after the last one's answer was written: pipelined
// requests wait in the socket and are answered in order.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl& f, tcp::socket socket, bool refuse)
      : f_(f),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        deadline_(socket_.get_executor()),
        watch_(socket_.get_executor()),
        refuse_(refuse) {
    (refuse_ ? f_.refusing : f_.open_connections)++;
  }
  ~Connection() {
    (refuse_ ? f_.refusing : f_.open_connections)--;
    std::lock_guard<std::mutex> lock(f_.connections_mu);
    f_.connections.erase(this);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      if (self->refuse_) {
        self->version_ = 11;
        return self->send_error(
            ApiError{503,
                     "the server has " + std::to_string(self->f_.options.max_connections) +
                         " connections open (--http-max-connections); try again shortly",
                     "server_error", "", "too_many_connections"},
            /*close=*/true, {{"Retry-After", "1"}});
      }
      self->wait_request(/*first=*/true);
    });
  }
  // From HttpFront::stop(): ends what the connection does (a stream's jobs are cancelled).
  void shut() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      const bool collecting = self->cphase_ == CPhase::kCollecting;
      self->end_request();
      if (collecting)
        return self->send_error(ApiError{503, "the server is stopping", "server_error", "", ""}, true);
      self->close_now();
    });
  }

 private:
  enum class Phase { kIdle, kHeader, kBody, kHandling, kClosing };
  enum class CPhase { kNone, kStatus, kAccepting, kCollecting, kStreaming };

  // ---- reading a request ----

  // Waits for a request's first byte: up to the header timeout on a new
  // connection, the keep-alive timeout between requests (then closes quietly).
  void wait_request(bool first) {
    if (f_.stopping) return close_now();
    if (buffer_.size() > 0) return read_header();
    phase_ = Phase::kIdle;
    arm(first ? f_.options.header_timeout_s : f_.options.keep_alive_s, Phase::kIdle);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      if (ec || self->phase_ != Phase::kIdle) return;
      self->read_header();
    });
  }

  void read_header() {
    phase_ = Phase::kHeader;
    ++gen_;
    arm(f_.options.header_timeout_s, Phase::kHeader);
    header_.emplace();
    header_->header_limit(
        static_cast<std::uint32_t>(std::min<size_t>(f_.options.max_header_bytes, UINT32_MAX)));
    // The declared size is checked after the route and the key. (Not boost::none: Beast 1.74 compares
    // the length with the optional, and every length is above none.)
    header_->body_limit(std::numeric_limits<std::uint64_t>::max());
    http::async_read_header(socket_, buffer_, *header_,
                            [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    if (phase_ != Phase::kHeader) return;  // timed out: the 408 is on its way
    timer_.cancel();
    if (client_went_away(ec)) return close_now();
    version_ = 11;
    if (ec == http::error::header_limit) {
      return send_error(
          ApiError{431,
                   "the request line and header are over " + std::to_string(f_.options.max_header_bytes) +
                       " bytes (--http-max-header-bytes)",
                   "invalid_request_error", "", ""},
          true);
    }
    if (ec)
      return send_error(
          ApiError{400, "malformed HTTP request: " + ec.message(), "invalid_request_error", "", ""}, true);
    const auto& req = header_->get();
    version_ = req.version() == 10 ? 10 : 11;
    keep_alive_ = req.keep_alive();
    method_ = std::string(req.method_string());
    target_ = std::string(req.target());
    route_ = route_of(req.method(), target_);
    phase_ = Phase::kHandling;
    // Everything that can be refused on the header alone is, before a byte
    // of the body is read; the body then stays unread, so the connection closes.
    const bool has_body = !header_->is_done();
    if (route_ == Route::kNone) {
      return send_error(ApiError{404, "no route for " + method_ + " " + target_.substr(0, target_.find('?')),
                                 "invalid_request_error", "", ""},
                        has_body);
    }
    if (needs_key(route_) && !f_.authorized(std::string(req[http::field::authorization]))) {
      return send_error(ApiError{401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                                 "invalid_request_error", "", "invalid_api_key"},
                        has_body, {{"WWW-Authenticate", "Bearer"}});
    }
    const auto declared = header_->content_length();
    if (declared && *declared > f_.options.max_body_bytes) return too_large();
    if (!has_body) return dispatch(std::string());
    body_.emplace(std::move(*header_));
    header_.reset();
    body_->body_limit(f_.options.max_body_bytes);
    phase_ = Phase::kBody;
    arm(f_.options.body_timeout_s, Phase::kBody);
    if (beast::iequals(body_->get()[http::field::expect], "100-continue"))
      write("HTTP/1.1 100 Continue\r\n\r\n");
    http::async_read(socket_, buffer_, *body_,
                     [self = shared_from_this()](error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(error_code ec) {
    if (phase_ != Phase::kBody) return;
    timer_.cancel();
    phase_ = Phase::kHandling;
    if (ec == http::error::body_limit) return too_large();
    if (client_went_away(ec)) return close_now();
    if (ec)
      return send_error(
          ApiError{400, "malformed HTTP request body: " + ec.message(), "invalid_request_error", "", ""},
          true);
    std::string body = std::move(body_->get().body());
    body_.reset();
    dispatch(std::move(body));
  }

  void too_large() {
    send_error(ApiError{413,
                        "the request body is over " + std::to_string(f_.options.max_body_bytes) +
                            " bytes (--http-max-body-bytes)",
                        "invalid_request_error", "", ""},
               true);
  }

  // One timer for the reading phases: past its time in `phase`, a
  // connection waiting for a request closes quietly, one in a request's
  // header or body gets a 408.
  void arm(int32_t seconds, Phase phase) {
    timer_.expires_after(std::chrono::seconds(std::max(1, seconds)));
    timer_.async_wait([self = shared_from_this(), phase, gen = gen_](error_code ec) {
      if (ec || self->phase_ != phase || self->gen_ != gen) return;
      if (phase == Phase::kIdle) return self->close_now();
      self->phase_ = Phase::kHandling;
      error_code ignored;
      self->socket_.cancel(ignored);  // the read in progress ends (its handler sees the phase)
      const bool header = phase == Phase::kHeader;
      self->send_error(ApiError{408,
                                std::string(header ? "the request header" : "the request body") +
                                    " did not arrive within " +
                                    std::to_string(header ? self->f_.options.header_timeout_s
                                                          : self->f_.options.body_timeout_s) +
                                    " s (" + (header ? "--http-header-timeout" : "--http-body-timeout") + ")",
                                "invalid_request_error", "", "timeout"},
                       true);
    });
  }

  // ---- answering ----

  void dispatch(std::string body) {
    switch (route_) {
      case Route::kCompletions:
        return completions(body);
      case Route::kChat:
        return send_error(ApiError{400,
                                   "chat completions are not supported: GPT-2 has no chat template; send a "
                                   "prompt to /v1/completions instead",
                                   "invalid_request_error", "", "chat_not_supported"});
      case Route::kModels:
        return send_json(200, json{{"object", "list"},
                                   {"data", json::array({{{"id", f_.options.model_name},
                                                          {"object", "model"},
                                                          {"created", f_.started_unix},
                                                          {"owned_by", "troupe"},
                                                          {"max_model_len", f_.options.max_model_len}}})}});
      case Route::kHealth:
        return ask_status(std::chrono::seconds(7), [this](const std::optional<actors::StatusReport>& st) {
          const int32_t n = f_.note_status(st);
          // Draining (SIGTERM): 503, so that a load balancer sends new work elsewhere;
          // and whenever the router or the batcher does not answer: no job can run.
          const std::string silent = f_.silent();
          const std::string state = !silent.empty() ? silent
                                    : f_.draining() ? "draining"
                                    : n > 0         ? "ok"
                                                    : "no workers";
          send_json(state == "ok" ? 200 : 503, json{{"status", state}, {"workers", n}});
        });
      case Route::kMetrics:
        return ask_status(std::chrono::seconds(10), [this](const std::optional<actors::StatusReport>& st) {
          if (!st) return send_error(ApiError{503, "the router did not answer", "server_error", "", ""});
          respond(200, "text/plain; version=0.0.4; charset=utf-8", f_.metrics->render(*st));
        });
      case Route::kNone:
        break;
    }
  }

  void respond(int status, const std::string& content_type, const std::string& body, bool close = false,
               const Headers& extra = {}) {
    close = close || !keep_alive_ || f_.stopping;
    write(response_bytes(status, content_type, body, close, version_, extra));
    finish_response(close);
  }
  void send_json(int status, const json& body) { respond(status, "application/json", openai::dump(body)); }
  void send_error(const ApiError& e, bool close = false, const Headers& extra = {}) {
    respond(e.status, "application/json", openai::dump(openai::to_json(e)), close, extra);
  }

  // ---- a status query (health, metrics, whether any worker has joined) ----

  using StatusThen = std::function<void(const std::optional<actors::StatusReport>&)>;
  void ask_status(std::chrono::milliseconds patience, StatusThen then) {
    cphase_ = CPhase::kStatus;
    status_then_ = std::move(then);
    session_ = std::make_unique<Impl::Session>(f_, listener());
    caf::anon_send(f_.router, actors::status_atom::value, session_->client);
    deadline_.expires_after(patience);
    deadline_.async_wait([self = shared_from_this(), gen = gen_](error_code ec) {
      if (!ec && self->gen_ == gen && self->cphase_ == CPhase::kStatus) self->status_done(std::nullopt);
    });
  }
  void status_done(const std::optional<actors::StatusReport>& st) {
    deadline_.cancel();
    session_.reset();
    cphase_ = CPhase::kNone;
    StatusThen then = std::move(status_then_);
    status_then_ = nullptr;
    then(st);
  }

  // Where the router's replies for this request go: posted to the strand,
  // dropped there if the request is over.
  Registry::Listener listener() {
    return [w = weak_from_this(), gen = gen_, ex = socket_.get_executor()](actors::ClientMessage&& m) {
      asio::post(ex, [w, gen, m = std::move(m)]() mutable {
        if (auto self = w.lock()) self->on_reply(gen, std::move(m));
      });
    };
  }

  // ---- completions ----

  void completions(const std::string& body) {
    auto parsed = openai::parse_completion_request(body, f_.options.model_name);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*e);
    request_ =
        std::make_unique<openai::CompletionRequest>(std::move(std::get<openai::CompletionRequest>(parsed)));
    if (request_->jobs.size() > static_cast<size_t>(f_.options.max_queue)) {
      // Not 429: it would be refused however long the client waited.
      const size_t asked = request_->jobs.size();
      request_.reset();
      return send_error(ApiError{400,
                                 "this request asks for " + std::to_string(asked) +
                                     " sequences (prompts x n) but the server queues at most " +
                                     std::to_string(f_.options.max_queue) +
                                     " (--max-queue): send fewer prompts or a smaller n",
                                 "invalid_request_error", "n", ""});
    }
    auto go = [this](int32_t workers) {
      if (workers == 0) {
        request_.reset();
        return send_error(ApiError{503,
                                   "no worker has joined this server yet; try again when GET /health says ok",
                                   "server_error", "", "no_workers"});
      }
      submit();
    };
    if (auto n = f_.cached_workers()) return go(*n);
    ask_status(std::chrono::seconds(7),
               [this, go](const std::optional<actors::StatusReport>& st) { go(f_.note_status(st)); });
  }

  void submit() {
    session_ = std::make_unique<Impl::Session>(f_, listener());
    session_->jobs_open = true;
    for (const transport::Submit& job : request_->jobs) {
      caf::anon_send(f_.router, actors::submit_atom::value, session_->client, job);
    }
    // Every job is answered at once with Accepted or Rejected; anything else
    // that comes meanwhile (a job's first tokens) is kept for later.
    cphase_ = CPhase::kAccepting;
    answered_ = 0;
    rejected_.reset();
    early_.clear();
    deadline_.expires_after(std::chrono::seconds(60));
    deadline_.async_wait([self = shared_from_this(), gen = gen_](error_code ec) {
      if (ec || self->gen_ != gen || self->cphase_ != CPhase::kAccepting) return;
      self->end_request();
      self->send_error(ApiError{503, "the router did not answer", "server_error", "", ""});
    });
  }

  void on_reply(uint64_t gen, actors::ClientMessage&& m) {
    if (gen != gen_) return;
    switch (cphase_) {
      case CPhase::kStatus:
        if (auto* r = std::get_if<actors::StatusReport>(&m)) status_done(*r);
        return;
      case CPhase::kAccepting:
        if (std::holds_alternative<transport::Accepted>(m)) {
          ++answered_;
        } else if (auto* r = std::get_if<transport::Rejected>(&m)) {
          ++answered_;
          if (!rejected_) rejected_ = *r;
        } else {
          early_.push_back(std::move(m));
        }
        if (answered_ < request_->jobs.size()) return;
        deadline_.cancel();
        if (rejected_) {
          const ApiError e = openai::from_rejected(*rejected_);
          end_request();  // the session's end cancels the jobs that were taken
          return send_error(e);
        }
        return begin_results();
      case CPhase::kCollecting:
        apply(m);
        if (builder_->done()) complete_plain();
        return;
      case CPhase::kStreaming:
        return stream(m);
      case CPhase::kNone:
        return;
    }
  }

  std::optional<json> apply(const actors::ClientMessage& m) {
    if (auto* t = std::get_if<transport::Tokens>(&m)) return builder_->on_tokens(*t);
    if (auto* fin = std::get_if<transport::Finished>(&m)) return builder_->on_finished(*fin);
    return std::nullopt;
  }

  void begin_results() {
    builder_ = std::make_unique<openai::CompletionBuilder>(*request_, f_.new_id(),
                                                           static_cast<int64_t>(std::time(nullptr)),
                                                           f_.options.model_name, f_.tokenizer);
    probed_ = false;
    watch();
    std::deque<actors::ClientMessage> early = std::move(early_);
    early_.clear();
    if (!request_->stream) {
      cphase_ = CPhase::kCollecting;
      if (f_.options.request_timeout_s > 0) {
        deadline_.expires_after(std::chrono::seconds(f_.options.request_timeout_s));
        deadline_.async_wait([self = shared_from_this(), gen = gen_](error_code ec) {
          if (ec || self->gen_ != gen || self->cphase_ != CPhase::kCollecting) return;
          self->end_request();  // the session's end cancels its jobs
          self->send_error(ApiError{504,
                                    "the completion took longer than " +
                                        std::to_string(self->f_.options.request_timeout_s) +
                                        " s (--http-request-timeout); its jobs were cancelled",
                                    "server_error", "", "timeout"});
        });
      }
      for (auto& m : early) apply(m);
      if (builder_->done()) complete_plain();
      return;
    }
    cphase_ = CPhase::kStreaming;
    chunked_ = version_ == 11;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends when the connection does
    Headers headers = {
        {"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
    headers.emplace_back(chunked_ ? "Transfer-Encoding" : "Connection", chunked_ ? "chunked" : "close");
    write(response_head(200, version_, headers));
    for (auto& m : early) {
      if (cphase_ != CPhase::kStreaming) break;
      stream(m);
    }
  }

  void complete_plain() {
    session_->jobs_open = false;
    const std::optional<ApiError> failure = builder_->failure();
    json response = failure ? json() : builder_->response();
    end_request();
    if (failure) return send_error(*failure);
    send_json(200, response);
  }

  void stream(const actors::ClientMessage& m) {
    std::string out;
    if (auto chunk = apply(m)) out = sse(*chunk);
    const bool done = builder_->done();
    if (done) {
      if (builder_->failure()) out += sse(openai::to_json(*builder_->failure()));
      if (request_->include_usage) out += sse(builder_->usage_chunk());
      out += "data: [DONE]\n\n";
      session_->jobs_open = false;
    }
    if (!out.empty()) write_chunk(out);
    if (out_bytes_ > kMaxStreamBacklog) return gone();  // it does not read: its jobs are cancelled
    if (!done) return;
    if (chunked_) write("0\r\n\r\n");
    end_request();
    finish_response(!keep_alive_ || f_.stopping);
  }

  void write_chunk(const std::string& data) {
    if (chunked_) return write(hex(data.size()) + "\r\n" + data + "\r\n");
    write(data);
  }

  // Every 100 ms while the router works for the request: a client that hung
  // up (reset, or closed and then reset by the probe below) is gone. One that
  // only shut its sending side may still read: it is probed once, with
  // what HTTP lets a server send at that point (an interim 100 Continue
  // before a plain answer, which every HTTP/1.1 client must skip; an SSE
  // comment in a stream); a closed socket answers the probe with a reset.
  void watch() {
    watch_.expires_after(kWatchEvery);
    watch_.async_wait([self = shared_from_this(), gen = gen_](error_code ec) {
      if (ec || self->gen_ != gen) return;
      if (self->cphase_ != CPhase::kCollecting && self->cphase_ != CPhase::kStreaming) return;
      pollfd p{self->socket_.native_handle(), POLLRDHUP, 0};
      if (::poll(&p, 1, 0) == 1) {
        if (p.revents & (POLLHUP | POLLERR)) return self->gone();
        if ((p.revents & POLLRDHUP) && !self->probed_) {
          self->probed_ = true;
          if (self->cphase_ == CPhase::kStreaming) {
            self->write_chunk(": are you there?\n\n");
          } else if (self->version_ == 11) {
            self->write("HTTP/1.1 100 Continue\r\n\r\n");
          }
        }
      }
      self->watch();
    });
  }

  // The client went away: its jobs are cancelled, the connection closed.
  void gone() {
    end_request();
    close_now();
  }

  // The request's router client ends (its open jobs are cancelled).
  void end_request() {
    ++gen_;
    cphase_ = CPhase::kNone;
    session_.reset();
    builder_.reset();
    request_.reset();
    status_then_ = nullptr;
    early_.clear();
    deadline_.cancel();
    watch_.cancel();
  }

  // ---- writing ----

  void write(std::string bytes) {
    if (phase_ == Phase::kClosing || !socket_.is_open()) return;
    out_bytes_ += bytes.size();
    outq_.push_back(std::move(bytes));
    if (!writing_) write_next();
  }
  void write_next() {
    writing_ = true;
    asio::async_write(socket_, asio::buffer(outq_.front()),
                      [self = shared_from_this()](error_code ec, size_t) { self->on_written(ec); });
  }
  void on_written(error_code ec) {
    writing_ = false;
    if (ec) {
      outq_.clear();
      out_bytes_ = 0;
      return gone();
    }
    out_bytes_ -= outq_.front().size();
    outq_.pop_front();
    if (!outq_.empty()) return write_next();
    after_response();
  }
  // The response is whole once the queue is written: then the next request, or the end.
  void finish_response(bool close) {
    response_done_ = true;
    close_after_ = close;
    if (!writing_ && outq_.empty()) after_response();
  }
  void after_response() {
    if (!response_done_) return;
    response_done_ = false;
    if (close_after_) return linger_close();
    wait_request(/*first=*/false);
  }

  // ---- closing ----

  void close_now() {
    phase_ = Phase::kClosing;
    error_code ignored;
    timer_.cancel();
    deadline_.cancel();
    watch_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }
  // Sends our FIN, then reads and discards what the client still sends
  // (for at most kLingerFor) before closing: closing with unread input
  // would reset the connection and could destroy our answer before the
  // client reads it.
  void linger_close() {
    phase_ = Phase::kClosing;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    discard_.resize(16384);
    timer_.expires_after(kLingerFor);
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->close_now();
    });
    drain();
  }
  void drain() {
    socket_.async_read_some(asio::buffer(discard_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->close_now();
      self->drain();
    });
  }

  Impl& f_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  asio::steady_timer timer_;     // reading phases and lingering close
  asio::steady_timer deadline_;  // a request's: router answer, request timeout, status patience
  asio::steady_timer watch_;     // the hang-up watch
  const bool refuse_;
  Phase phase_ = Phase::kIdle;
  uint64_t gen_ = 0;  // a request's number: timers and replies of an older one are ignored
  std::optional<http::request_parser<http::empty_body>> header_;
  std::optional<http::request_parser<http::string_body>> body_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  std::string method_, target_;
  Route route_ = Route::kNone;
  // The request's work.
  CPhase cphase_ = CPhase::kNone;
  std::unique_ptr<Impl::Session> session_;
  StatusThen status_then_;
  std::unique_ptr<openai::CompletionRequest> request_;
  std::unique_ptr<openai::CompletionBuilder> builder_;
  std::deque<actors::ClientMessage> early_;
  std::optional<transport::Rejected> rejected_;
  size_t answered_ = 0;
  bool chunked_ = false, probed_ = false;
  // Writing.
  std::deque<std::string> outq_;
  size_t out_bytes_ = 0;
  bool writing_ = false, response_done_ = false, close_after_ = false;
  std::vector<char> discard_;
};

}  // namespace

void HttpFront::Impl::accept() {
  acceptor->async_accept(asio::make_strand(*ioc), [this](error_code ec, tcp::socket socket) {
    if (stopping || !acceptor->is_open()) return;
    if (ec) {
      // Out of descriptors (or another passing failure): try again shortly, without spinning.
      accept_pause->expires_after(std::chrono::milliseconds(50));
      accept_pause->async_wait([this](error_code) {
        if (!stopping) accept();
      });
      return;
    }
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // one small SSE chunk per token: no Nagle delay
    const bool refuse = open_connections >= options.max_connections;
    if (refuse && refusing >= std::max(64, options.max_connections / 4)) {
      socket.close(ignored);  // even the refusals are too many: just close
    } else {
      auto c = std::make_shared<Connection>(*this, std::move(socket), refuse);
      {
        std::lock_guard<std::mutex> lock(connections_mu);
        connections.emplace(c.get(), c);
      }
      c->start();
    }
    accept();
  });
}

HttpFront::HttpFront(const HttpOptions& options, const model::Tokenizer& tokenizer,
                     std::shared_ptr<MetricsCollector> metrics)
    : impl_(std::make_shared<Impl>(options, tokenizer, std::move(metrics))) {
  if (options.threads < 1) throw std::invalid_argument("--http-threads must be >= 1");
  if (options.max_connections < 1) throw std::invalid_argument("--http-max-connections must be >= 1");
}

HttpFront::~HttpFront() { stop(); }

actors::ClientSink HttpFront::sink() const {
  std::shared_ptr<Registry> registry = impl_->registry;
  return [registry](const actors::Reply& r) { registry->deliver(r); };
}

void HttpFront::bind() {
  Impl& f = *impl_;
  const auto [host, port] = split_host_port(f.options.listen);
  error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) throw std::invalid_argument("--http " + f.options.listen + ": '" + host + "' is not an IP address");
  // Every connection is a descriptor: as many as the hard limit allows, and
  // the connection limit under it (with room for the rest of the head).
  const rlim_t files = raise_file_limit();
  if (files < static_cast<rlim_t>(f.options.max_connections) + 256) {
    const int32_t fit = static_cast<int32_t>(std::max<rlim_t>(files, 512) - 256);
    std::cerr << "troupe serve: --http-max-connections " << f.options.max_connections << " lowered to " << fit
              << ": this process may open " << files << " files (ulimit -n)\n";
    f.options.max_connections = fit;
  }
  f.ioc.emplace(f.options.threads);
  f.accept_pause.emplace(*f.ioc);
  f.acceptor.emplace(*f.ioc);
  const tcp::endpoint want(address, static_cast<unsigned short>(port));
  f.acceptor->open(want.protocol(), ec);
  // SO_REUSEADDR alone: a restart binds again at once; a port in use is an error.
  if (!ec) f.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) f.acceptor->bind(want, ec);
  // A burst of connects (a client opening 64 streams at once) must queue, not be dropped.
  if (!ec) f.acceptor->listen(1024, ec);
  if (ec) {
    f.acceptor.reset();
    throw std::runtime_error("--http " + f.options.listen + ": cannot bind (" + ec.message() + ")");
  }
  const auto bound = f.acceptor->local_endpoint();
  f.endpoint =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound.port());
}

void HttpFront::start(actors::router_actor router) {
  Impl& f = *impl_;
  if (f.endpoint.empty()) throw std::logic_error("HttpFront::start before bind");
  f.router = std::move(router);
  f.accept();
  for (int32_t i = 0; i < f.options.threads; ++i) {
    f.threads.emplace_back([&f] {
      for (;;) {
        try {
          f.ioc->run();
          return;
        } catch (const std::exception& e) {  // a handler's bug ends its request, not the server
          std::cerr << "troupe serve: HTTP: " << e.what() << "\n";
        }
      }
    });
  }
}

std::string HttpFront::endpoint() const { return impl_->endpoint; }

void HttpFront::stop() {
  Impl& f = *impl_;
  if (f.threads.empty()) {
    f.router = nullptr;
    return;
  }
  // Streams whose jobs are done may still be writing their last chunks:
  // give them a moment.
  for (int i = 0; i < 50 && !f.registry->empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  f.stopping = true;
  asio::post(*f.ioc, [&f] {
    error_code ignored;
    f.acceptor->close(ignored);
    f.accept_pause->cancel();
  });
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard<std::mutex> lock(f.connections_mu);
    for (auto& [raw, weak] : f.connections) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) c->shut();
  open.clear();  // outside the lock: the last reference's end takes it
  // Answers in flight (a 503 to a plain request) get a moment to be written.
  for (int i = 0; i < 20 && f.open_connections + f.refusing > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  f.ioc->stop();
  for (auto& t : f.threads) t.join();
  f.threads.clear();
  f.registry->clear();  // the sink posts nothing more
  // Connections still held by handlers end here, while the router can still take their "gone".
  f.acceptor.reset();
  f.accept_pause.reset();
  f.ioc.reset();
  f.router = nullptr;  // no handle outlives the actor system
}

}  // namespace troupe::cluster
