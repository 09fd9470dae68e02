#include "cluster/http_front.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "cluster/metrics_collector.hpp"
#include "cluster/openai_api.hpp"
#include "core/splitmix.hpp"
#include "transport/endpoint_policy.hpp"

namespace troupe::cluster {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using openai::ApiError;

// The connection of one HTTP request, watched for the client hanging up.
// cpp-httplib 0.11.4 shows a handler neither its socket nor whether the
// client is still there (only a streaming response's sink knows): the socket
// is found once among the process's descriptors by its two addresses, the
// ones the request names, and polled for a hangup. Not found: never gone.
// The search (two syscalls per open descriptor) waits until the request has
// been open for kSearchAfter: one answered sooner never pays for it.
class PeerWatch {
 public:
  explicit PeerWatch(const httplib::Request& req) : req_(req), opened_(Clock::now()) {}
  // The client closed (or reset) the connection.
  bool gone() {
    if (!searched_) {
      if (Clock::now() - opened_ < kSearchAfter) return false;
      find_socket();
    }
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

 private:
  static bool address_is(const sockaddr_storage& a, const std::string& ip, int port) {
    char text[INET6_ADDRSTRLEN] = {};
    int p = -1;
    if (a.ss_family == AF_INET) {
      const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
      ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
      p = ntohs(v4.sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
      ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
      p = ntohs(v6.sin6_port);
    }
    return p == port && ip == text;
  }
  static bool same_socket(int fd, const httplib::Request& req) {
    sockaddr_storage local{}, peer{};
    socklen_t n = sizeof local, m = sizeof peer;
    return ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n) == 0 &&
           ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &m) == 0 &&
           address_is(peer, req.remote_addr, req.remote_port) &&
           address_is(local, req.local_addr, req.local_port);
  }
  void find_socket() {
    searched_ = true;
    DIR* fds = ::opendir("/proc/self/fd");
    if (!fds) return;
    while (const dirent* e = ::readdir(fds)) {
      const int fd = std::atoi(e->d_name);
      if (fd > 2 && same_socket(fd, req_)) {
        fd_ = fd;
        break;
      }
    }
    ::closedir(fds);
  }
  static constexpr std::chrono::milliseconds kSearchAfter{100};
  const httplib::Request& req_;
  const Clock::time_point opened_;
  bool searched_ = false;
  int fd_ = -1;
};

// One HTTP request's replies from the router, in order.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<actors::ClientMessage> queue;

  void push(actors::ClientMessage m) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(m));
    }
    cv.notify_one();
  }
  std::optional<actors::ClientMessage> pop(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, wait, [&] { return !queue.empty(); })) return std::nullopt;
    actors::ClientMessage m = std::move(queue.front());
    queue.pop_front();
    return m;
  }
};

// Client id -> mailbox. The sink (router's thread) and the handlers share it.
struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<Mailbox>> boxes;

  void deliver(const actors::Reply& r) {
    std::shared_ptr<Mailbox> box;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = boxes.find(r.client);
      if (it == boxes.end()) return;  // the request is over: nobody listens
      box = it->second;
    }
    box->push(r.message);
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

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(openai::dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, openai::to_json(e)); }

std::string sse(const json& j) { return "data: " + openai::dump(j) + "\n\n"; }

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
  httplib::Server server;
  std::thread thread;
  std::string endpoint;
  std::atomic<bool> stopping{false};
  std::atomic<bool> listen_returned{false};
  std::atomic<uint64_t> next_client{1};
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

  // One HTTP request as a router client: its mailbox is registered for its
  // life; jobs it leaves unfinished are cancelled ("gone") when it ends.
  struct Session {
    Impl& front;
    std::string client;
    std::shared_ptr<Mailbox> box = std::make_shared<Mailbox>();
    bool jobs_open = false;

    explicit Session(Impl& f) : front(f), client("h" + std::to_string(f.next_client++)) {
      std::lock_guard<std::mutex> lock(front.registry->mu);
      front.registry->boxes.emplace(client, box);
    }
    ~Session() {
      {
        std::lock_guard<std::mutex> lock(front.registry->mu);
        front.registry->boxes.erase(client);
      }
      if (jobs_open) {
        caf::anon_send(front.router, actors::gone_atom::value, client);
        front.metrics->forget(client);
      }
    }
  };

  // The router's status report; nullopt when it does not answer within
  // `patience` (the router waits up to 5 s for the batcher, then answers without it).
  std::optional<actors::StatusReport> status(std::chrono::milliseconds patience = std::chrono::seconds(10)) {
    Session s(*this);
    caf::anon_send(router, actors::status_atom::value, s.client);
    const auto deadline = Clock::now() + patience;
    while (Clock::now() < deadline && !stopping) {
      auto m = s.box->pop(std::chrono::milliseconds(200));
      if (m) {
        if (auto* r = std::get_if<actors::StatusReport>(&*m)) return *r;
      }
    }
    return std::nullopt;
  }

  // Workers the router knows of; asked again when older than a second or 0,
  // or when the router or the batcher did not answer last time (`fresh`: always).
  int32_t workers(bool fresh = false) {
    {
      std::lock_guard<std::mutex> lock(workers_mu);
      if (!fresh && known_workers > 0 && known_silent.empty() &&
          Clock::now() - known_at < std::chrono::seconds(1))
        return known_workers;
    }
    auto st = status(std::chrono::seconds(7));
    std::lock_guard<std::mutex> lock(workers_mu);
    known_workers = st ? st->router.workers : 0;
    known_draining = st && st->router.shutting_down;
    known_silent = !st                     ? "the router is not answering"
                   : !st->batcher.answered ? "the batcher is not answering"
                                           : "";
    known_at = Clock::now();
    return known_workers;
  }
  // Which of the router and the batcher did not answer, as of the last workers(); "" = both did.
  std::string silent() {
    std::lock_guard<std::mutex> lock(workers_mu);
    return known_silent;
  }
  // Whether the router is draining, as of the last workers().
  bool draining() {
    std::lock_guard<std::mutex> lock(workers_mu);
    return known_draining || stopping;
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (h.compare(0, prefix.size(), prefix) == 0 && same_secret(h.substr(prefix.size()), options.api_key)) {
      return true;
    }
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, ApiError{401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                             "invalid_request_error", "", "invalid_api_key"});
    return false;
  }

  std::string new_id() {
    static std::atomic<uint64_t> counter{0};
    char buf[40];
    std::snprintf(buf, sizeof buf, "cmpl-%016llx",
                  static_cast<unsigned long long>(core::splitmix64(id_base ^ counter++)));
    return buf;
  }

  void completions(const httplib::Request& req, httplib::Response& res);
  void install_routes();
};

void HttpFront::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  if (!authorized(req, res)) return;
  auto parsed = openai::parse_completion_request(req.body, options.model_name);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  auto request =
      std::make_shared<openai::CompletionRequest>(std::move(std::get<openai::CompletionRequest>(parsed)));
  if (request->jobs.size() > static_cast<size_t>(options.max_queue)) {
    // Not 429: it would be refused however long the client waited.
    return send_error(res, ApiError{400,
                                    "this request asks for " + std::to_string(request->jobs.size()) +
                                        " sequences (prompts x n) but the server queues at most " +
                                        std::to_string(options.max_queue) +
                                        " (--max-queue): send fewer prompts or a smaller n",
                                    "invalid_request_error", "n", ""});
  }
  if (workers() == 0) {
    return send_error(
        res, ApiError{503, "no worker has joined this server yet; try again when GET /health says ok",
                      "server_error", "", "no_workers"});
  }
  auto session = std::make_shared<Session>(*this);
  session->jobs_open = true;
  for (const transport::Submit& job : request->jobs) {
    caf::anon_send(router, actors::submit_atom::value, session->client, job);
  }
  // Every job is answered at once with Accepted or Rejected; anything else
  // that comes meanwhile (a job's first tokens) is kept for later.
  std::deque<actors::ClientMessage> early;
  std::optional<transport::Rejected> rejected;
  size_t answered = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (answered < request->jobs.size()) {
    auto m = session->box->pop(std::chrono::milliseconds(200));
    if (!m) {
      if (Clock::now() > deadline || stopping) {
        return send_error(res, ApiError{503, "the router did not answer", "server_error", "", ""});
      }
      continue;
    }
    if (std::holds_alternative<transport::Accepted>(*m)) {
      ++answered;
    } else if (auto* r = std::get_if<transport::Rejected>(&*m)) {
      ++answered;
      if (!rejected) rejected = *r;
    } else {
      early.push_back(std::move(*m));
    }
  }
  if (rejected) return send_error(res, openai::from_rejected(*rejected));  // the session cancels the rest

  auto builder = std::make_shared<openai::CompletionBuilder>(
      *request, new_id(), static_cast<int64_t>(std::time(nullptr)), options.model_name, tokenizer);
  // Applies one reply; the chunk to stream, if any.
  auto apply = [builder](const actors::ClientMessage& m) -> std::optional<json> {
    if (auto* t = std::get_if<transport::Tokens>(&m)) return builder->on_tokens(*t);
    if (auto* f = std::get_if<transport::Finished>(&m)) return builder->on_finished(*f);
    return std::nullopt;
  };

  if (!request->stream) {
    for (auto& m : early) apply(m);
    PeerWatch peer(req);
    const auto give_up = Clock::now() + std::chrono::seconds(options.request_timeout_s);
    while (!builder->done()) {
      if (stopping) return send_error(res, ApiError{503, "the server is stopping", "server_error", "", ""});
      if (options.request_timeout_s > 0 && Clock::now() > give_up) {  // the session's end cancels its jobs
        return send_error(
            res, ApiError{504,
                          "the completion took longer than " + std::to_string(options.request_timeout_s) +
                              " s (--http-request-timeout); its jobs were cancelled",
                          "server_error", "", "timeout"});
      }
      // A client that hung up: the session's end cancels its jobs (as a stream's does).
      if (peer.gone()) return send_error(res, ApiError{499, "the client closed the connection", "", "", ""});
      if (auto m = session->box->pop(std::chrono::milliseconds(100))) apply(*m);
    }
    session->jobs_open = false;
    if (builder->failure()) return send_error(res, *builder->failure());
    return send_json(res, 200, builder->response());
  }

  auto pending = std::make_shared<std::deque<actors::ClientMessage>>(std::move(early));
  const bool include_usage = request->include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream", [this, session, builder, pending, apply,
                                                         include_usage](size_t, httplib::DataSink& sink) {
    std::optional<actors::ClientMessage> m;
    if (!pending->empty()) {
      m = std::move(pending->front());
      pending->pop_front();
    } else {
      m = session->box->pop(std::chrono::milliseconds(100));
    }
    if (!m) return !stopping && sink.is_writable();  // false: the client left (or we stop); jobs cancelled
    std::string out;
    if (auto chunk = apply(*m)) out = sse(*chunk);
    if (builder->done()) {
      if (builder->failure()) out += sse(openai::to_json(*builder->failure()));
      if (include_usage) out += sse(builder->usage_chunk());
      out += "data: [DONE]\n\n";
      session->jobs_open = false;
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) return false;
    if (builder->done()) sink.done();
    return true;
  });
}

void HttpFront::Impl::install_routes() {
  server.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
  server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    send_error(res,
               ApiError{400,
                        "chat completions are not supported: GPT-2 has no chat template; send a prompt to "
                        "/v1/completions instead",
                        "invalid_request_error", "", "chat_not_supported"});
  });
  server.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    send_json(res, 200,
              json{{"object", "list"},
                   {"data", json::array({{{"id", options.model_name},
                                          {"object", "model"},
                                          {"created", started_unix},
                                          {"owned_by", "troupe"},
                                          {"max_model_len", options.max_model_len}}})}});
  });
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const int32_t n = workers(/*fresh=*/true);
    // Draining (SIGTERM): 503, so that a load balancer sends new work elsewhere;
    // and whenever the router or the batcher does not answer: no job can run.
    const std::string silent = this->silent();
    const std::string state = !silent.empty() ? silent
                              : draining()    ? "draining"
                              : n > 0         ? "ok"
                                              : "no workers";
    send_json(res, state == "ok" ? 200 : 503, json{{"status", state}, {"workers", n}});
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    auto st = status();
    if (!st) return send_error(res, ApiError{503, "the router did not answer", "server_error", "", ""});
    res.status = 200;
    res.set_content(metrics->render(*st), "text/plain; version=0.0.4; charset=utf-8");
  });
  // Every error without a body of its own (unknown path, body too large)
  // gets one in OpenAI's shape.
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = "HTTP " + std::to_string(res.status);
    if (res.status == 404) message = "no route for " + req.method + " " + req.path;
    if (res.status == 413) message = "the request body is too large";
    send_error(res, ApiError{res.status, message,
                             res.status >= 500 ? "server_error" : "invalid_request_error", "", ""});
  });
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError{500, what, "server_error", "", ""});
  });
}

HttpFront::HttpFront(const HttpOptions& options, const model::Tokenizer& tokenizer,
                     std::shared_ptr<MetricsCollector> metrics)
    : impl_(std::make_shared<Impl>(options, tokenizer, std::move(metrics))) {
  if (options.threads < 4) throw std::invalid_argument("--http-threads must be >= 4");
}

HttpFront::~HttpFront() { stop(); }

actors::ClientSink HttpFront::sink() const {
  std::shared_ptr<Registry> registry = impl_->registry;
  return [registry](const actors::Reply& r) { registry->deliver(r); };
}

ListenBacklog::ListenBacklog(httplib::Server& server, int backlog)
    : fd_(std::make_shared<int>(-1)), backlog_(backlog) {
  server.set_socket_options([fd = fd_](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    *fd = sock;  // the last socket tried is the one bound
  });
}

void ListenBacklog::after_bind() const {
  if (*fd_ < 0) throw std::runtime_error("the HTTP server's listening socket is unknown");
  if (::listen(*fd_, backlog_) != 0) throw std::runtime_error("cannot raise the HTTP listen backlog");
}

void HttpFront::bind() {
  Impl& f = *impl_;
  const auto [host, port] = split_host_port(f.options.listen);
  const size_t threads = static_cast<size_t>(f.options.threads);
  f.server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  f.server.set_tcp_nodelay(true);  // one small SSE chunk per token: no Nagle delay
  f.server.set_keep_alive_timeout(f.options.keep_alive_s);
  f.server.set_payload_max_length(f.options.max_body_bytes);
  f.install_routes();
  const ListenBacklog backlog(f.server);
  int bound = port;
  if (port == 0) {
    bound = f.server.bind_to_any_port(host);
    if (bound < 0) throw std::runtime_error("--http " + f.options.listen + ": cannot bind " + host);
  } else if (!f.server.bind_to_port(host, port)) {
    throw std::runtime_error("--http " + f.options.listen + ": cannot bind (in use, or not an address here)");
  }
  backlog.after_bind();
  f.endpoint = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound);
}

void HttpFront::start(actors::router_actor router) {
  Impl& f = *impl_;
  if (f.endpoint.empty()) throw std::logic_error("HttpFront::start before bind");
  f.router = std::move(router);
  f.thread = std::thread([&f] {
    f.server.listen_after_bind();
    f.listen_returned = true;
  });
  // stop() does nothing to a server that is not running yet: wait for it.
  while (!f.server.is_running() && !f.listen_returned)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::string HttpFront::endpoint() const { return impl_->endpoint; }

void HttpFront::stop() {
  Impl& f = *impl_;
  // Streams whose jobs are done may still be writing their last chunks:
  // give them a moment before the server stops calling them.
  for (int i = 0; i < 50 && f.thread.joinable(); ++i) {
    {
      std::lock_guard<std::mutex> lock(f.registry->mu);
      if (f.registry->boxes.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  f.stopping = true;
  if (f.thread.joinable()) {
    f.server.stop();
    f.thread.join();
  }
  f.router = nullptr;  // no handle outlives the actor system
}

}  // namespace troupe::cluster
