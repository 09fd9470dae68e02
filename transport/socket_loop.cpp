#include "transport/socket_loop.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "transport/log_throttle.hpp"
#include "transport/zap_handler.hpp"

namespace troupe::transport {
namespace {

constexpr int kMaxReadsPerWakeup = 256;  // per socket, so one busy peer cannot starve the others
constexpr size_t kKeptParts = 3;         // parts of one message kept; the rest are only counted

// A message that owns `body` without copying it.
zmq::message_t to_message(std::string&& body) {
  auto* owned = new std::string(std::move(body));
  return zmq::message_t(
      owned->data(), owned->size(), [](void*, void* hint) { delete static_cast<std::string*>(hint); }, owned);
}

// The peer's identity as hex, for log lines.
std::string hex(const std::string& id) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : id.substr(0, 16)) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out.empty() ? "-" : out;
}

std::string zap_domain(SocketId id) { return "troupe-" + std::to_string(id); }

// A client socket's identity at the server: random, so it cannot be guessed,
// and set by us, so it survives ZeroMQ's own reconnects of the socket (a
// ROUTER would otherwise name every new connection anew). Ids starting with
// a zero byte are the ROUTER's own, hence the first byte.
std::string random_routing_id() {
  static std::mutex mutex;
  static std::random_device device;
  std::lock_guard<std::mutex> lock(mutex);
  std::string id(16, '\0');
  for (char& c : id) c = static_cast<char>(device());
  id[0] = static_cast<char>(0x80 | (static_cast<unsigned char>(id[0]) & 0x7f));
  return id;
}

}  // namespace

struct SocketLoop::Impl {
  struct Command {
    enum Kind { kSend, kReconnect, kFlush } kind = kSend;
    SocketId socket = 0;
    std::string peer, body;
    std::shared_ptr<std::promise<void>> flushed = {};  // kFlush: set once the frames before it are written
    int linger_ms = 0;                                 // kFlush: the sockets' linger from then on
  };

  explicit Impl(const LoopOptions& o) : options(o), wakeup(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (wakeup < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  }
  ~Impl() { ::close(wakeup); }

  const LoopOptions& options;
  zmq::context_t ctx{1};
  std::vector<SocketOptions> specs;
  std::vector<std::string> endpoints;  // written by the loop thread before start() returns
  FrameHandler frame_handler;
  TickHandler tick_handler;
  UndeliverableHandler undeliverable_handler;
  ZapHandler zap;
  bool needs_zap = false;

  std::mutex mutex;  // guards outbox and running
  std::deque<Command> outbox;
  bool running = false;
  const int wakeup;  // eventfd: senders add 1 after queueing, the loop reads it to 0
  std::thread thread;

  std::atomic<uint64_t> frames_in{0}, bytes_in{0}, frames_out{0}, bytes_out{0}, oversize{0}, bad_envelopes{0},
      undeliverable{0}, auth_accepted{0}, auth_refused{0};
  LogThrottle oversize_log, envelope_log, undeliverable_log, auth_log, handler_log;

  // Loop thread only.
  std::vector<std::unique_ptr<zmq::socket_t>> sockets;
  std::unique_ptr<zmq::socket_t> zap_socket;

  void log(const std::string& line) const {
    if (options.log)
      options.log("transport: " + line);
    else
      std::cerr << "transport: " + line + "\n" << std::flush;
  }
  const std::string& name(SocketId id) const {
    return specs[id].name.empty() ? specs[id].endpoint : specs[id].name;
  }

  std::unique_ptr<zmq::socket_t> open(SocketId id) {
    const SocketOptions& o = specs[id];
    const bool server = o.role == SocketOptions::Role::kServer;
    auto s =
        std::make_unique<zmq::socket_t>(ctx, server ? zmq::socket_type::router : zmq::socket_type::dealer);
    s->set(zmq::sockopt::linger, 0);
    s->set(zmq::sockopt::sndhwm, o.send_hwm);
    s->set(zmq::sockopt::rcvhwm, o.recv_hwm);
    const size_t cut =
        options.disconnect_frame_bytes ? options.disconnect_frame_bytes : 2 * options.max_frame_bytes;
    s->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(cut));
    if (o.tcp_heartbeat_ms > 0) {
      s->set(zmq::sockopt::heartbeat_ivl, o.tcp_heartbeat_ms);
      s->set(zmq::sockopt::heartbeat_timeout, 3 * o.tcp_heartbeat_ms);
    }
    if (server) {
      s->set(zmq::sockopt::router_mandatory, true);  // a send to a vanished peer fails (EHOSTUNREACH)
      // A client back from a network blip takes its identity over even before
      // its old, dead connection has timed out (identities are unguessable).
      s->set(zmq::sockopt::router_handover, true);
      if (o.curve_server) {
        s->set(zmq::sockopt::zap_domain, zap_domain(id));
        s->set(zmq::sockopt::curve_server, true);
        s->set(zmq::sockopt::curve_secretkey, o.curve_server->secret_key);
      }
      s->bind(o.endpoint);
    } else {
      s->set(zmq::sockopt::routing_id, random_routing_id());
      s->set(zmq::sockopt::reconnect_ivl, o.reconnect_ivl_ms);
      s->set(zmq::sockopt::reconnect_ivl_max, o.reconnect_ivl_max_ms);
      if (o.curve_client) {
        s->set(zmq::sockopt::curve_serverkey, o.curve_client->server_key);
        s->set(zmq::sockopt::curve_publickey, o.curve_client->public_key);
        s->set(zmq::sockopt::curve_secretkey, o.curve_client->secret_key);
      }
      s->connect(o.endpoint);
    }
    return s;
  }

  void run(std::promise<void>& started);
  void poll_forever();
  void read_socket(SocketId id);
  void on_message(SocketId id, std::vector<zmq::message_t>& parts, size_t dropped_parts);
  void write(SocketId id, const std::string& peer, std::string&& body);
  void reply_error(SocketId id, const std::string& peer, ErrorCode code, const std::string& message);
  void dropped(SocketId id, const std::string& peer, const std::string& why);
  void serve_zap();
  void drain_outbox();
};

void SocketLoop::Impl::run(std::promise<void>& started) {
  try {
    if (needs_zap) {
      // The ZAP handler must be bound before any CURVE server socket exists (RFC 27).
      zap_socket = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::rep);
      zap_socket->set(zmq::sockopt::linger, 0);
      zap_socket->bind(ZapHandler::kEndpoint);
    }
    for (SocketId id = 0; id < static_cast<SocketId>(specs.size()); ++id) {
      try {
        sockets.push_back(open(id));
      } catch (const zmq::error_t& e) {
        throw std::runtime_error("socket " + name(id) + ": cannot " +
                                 (specs[id].role == SocketOptions::Role::kServer ? "bind " : "connect to ") +
                                 specs[id].endpoint + ": " + e.what());
      }
      endpoints[id] = specs[id].role == SocketOptions::Role::kServer
                          ? sockets.back()->get(zmq::sockopt::last_endpoint)
                          : specs[id].endpoint;
    }
  } catch (...) {
    sockets.clear();  // linger 0: closes at once
    zap_socket.reset();
    started.set_exception(std::current_exception());
    return;
  }
  started.set_value();
  try {
    poll_forever();
  } catch (const zmq::error_t& e) {
    if (e.num() != ETERM) log(std::string("loop stopped: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    running = false;
  }
  sockets.clear();
  zap_socket.reset();
}

void SocketLoop::Impl::poll_forever() {
  const auto tick = options.tick_interval;
  auto next_tick = Clock::now() + tick;
  std::vector<zmq::pollitem_t> items;
  for (;;) {
    items.clear();
    if (zap_socket) items.push_back({zap_socket->handle(), 0, ZMQ_POLLIN, 0});
    for (auto& s : sockets) items.push_back({s->handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({nullptr, wakeup, ZMQ_POLLIN, 0});

    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - Clock::now());
    wait = std::max(std::chrono::milliseconds(0), std::min(wait, tick));
    zmq::poll(items.data(), items.size(), wait);

    size_t k = 0;
    if (zap_socket && (items[k++].revents & ZMQ_POLLIN)) serve_zap();
    for (SocketId id = 0; id < static_cast<SocketId>(sockets.size()); ++id)
      if (items[k++].revents & ZMQ_POLLIN) read_socket(id);
    if (items[k].revents & ZMQ_POLLIN) {
      uint64_t n = 0;
      (void)!::read(wakeup, &n, sizeof n);  // to 0 before the swap: a later send wakes the next poll
      drain_outbox();
    }
    const auto now = Clock::now();
    if (now >= next_tick) {
      next_tick = now + tick;
      if (tick_handler) {
        try {
          tick_handler(now);
        } catch (const std::exception& e) {
          if (handler_log.allow()) log(std::string("on_tick threw: ") + e.what());
        }
      }
    }
  }
}

void SocketLoop::Impl::read_socket(SocketId id) {
  zmq::socket_t& s = *sockets[id];
  for (int n = 0; n < kMaxReadsPerWakeup; ++n) {
    std::vector<zmq::message_t> parts(1);
    if (!s.recv(parts[0], zmq::recv_flags::dontwait)) return;
    // The parts of one message arrive together: the rest never blocks.
    size_t dropped_parts = 0;
    bool more = parts[0].more();
    while (more) {
      zmq::message_t part;
      (void)s.recv(part, zmq::recv_flags::none);
      more = part.more();
      if (parts.size() < kKeptParts)
        parts.push_back(std::move(part));
      else
        ++dropped_parts;
    }
    on_message(id, parts, dropped_parts);
  }
}

void SocketLoop::Impl::on_message(SocketId id, std::vector<zmq::message_t>& parts, size_t dropped_parts) {
  const bool server = specs[id].role == SocketOptions::Role::kServer;
  const std::string peer = server ? parts[0].to_string() : std::string();
  const size_t first_body = server ? 1 : 0;
  const size_t bodies = parts.size() - first_body + dropped_parts;
  if (bodies != 1) {
    ++bad_envelopes;
    const std::string why = "a message must be one body frame, got " + std::to_string(bodies);
    if (envelope_log.allow()) log(name(id) + ": peer=" + hex(peer) + ": " + why);
    reply_error(id, peer, ErrorCode::kMalformed, why);
    return;
  }
  zmq::message_t& body = parts[first_body];
  if (body.size() > options.max_frame_bytes) {
    ++oversize;
    const std::string why = "frame of " + std::to_string(body.size()) + " bytes is over the limit of " +
                            std::to_string(options.max_frame_bytes) + " bytes";
    uint64_t count = 0;
    if (oversize_log.allow(&count))
      log(name(id) + ": peer=" + hex(peer) + ": " + why + " (" + std::to_string(count) + " so far)");
    reply_error(id, peer, ErrorCode::kTooLarge, why);
    return;
  }
  ++frames_in;
  bytes_in += body.size();
  if (!frame_handler) return;
  try {
    frame_handler(Frame{id, peer, body.to_string()});
  } catch (const std::exception& e) {
    if (handler_log.allow()) log(name(id) + ": on_frame threw: " + e.what());
  }
}

void SocketLoop::Impl::reply_error(SocketId id, const std::string& peer, ErrorCode code,
                                   const std::string& message) {
  write(id, peer, encode(Error{code, message, std::nullopt}));
}

void SocketLoop::Impl::dropped(SocketId id, const std::string& peer, const std::string& why) {
  ++undeliverable;
  uint64_t count = 0;
  if (undeliverable_log.allow(&count))
    log(name(id) + ": frame for peer=" + hex(peer) + " dropped: " + why + " (" + std::to_string(count) +
        " so far)");
  if (undeliverable_handler) {
    try {
      undeliverable_handler(id, peer);
    } catch (const std::exception& e) {
      if (handler_log.allow()) log(name(id) + ": on_undeliverable threw: " + e.what());
    }
  }
}

void SocketLoop::Impl::write(SocketId id, const std::string& peer, std::string&& body) {
  zmq::socket_t& s = *sockets[id];
  const size_t size = body.size();
  try {
    if (specs[id].role == SocketOptions::Role::kServer) {
      if (!s.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        return dropped(id, peer, "its queue is full");
      s.send(to_message(std::move(body)), zmq::send_flags::dontwait);  // parts after the first never block
    } else if (!s.send(to_message(std::move(body)), zmq::send_flags::dontwait)) {
      return dropped(id, peer, "the queue to the server is full");
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == ETERM) throw;
    return dropped(id, peer, e.num() == EHOSTUNREACH ? "the peer is gone" : e.what());
  }
  ++frames_out;
  bytes_out += size;
}

void SocketLoop::Impl::serve_zap() {
  std::vector<zmq::message_t> parts;
  if (!zmq::recv_multipart(*zap_socket, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
  std::vector<std::string> request;
  for (auto& p : parts) request.push_back(p.to_string());
  const ZapHandler::Decision d = zap.decide(request);
  const std::vector<std::string> reply = ZapHandler::reply(request, d);
  std::vector<zmq::const_buffer> frames;
  for (const std::string& f : reply) frames.push_back(zmq::buffer(f));
  zmq::send_multipart(*zap_socket, frames);
  if (d.accepted) {
    ++auth_accepted;
    return;
  }
  uint64_t count = 0;
  if (auth_log.allow(&count))
    log("refused CurveZMQ client key=" + (d.client_key.empty() ? "-" : d.client_key) +
        " address=" + d.address + ": " + d.reason + " (" + std::to_string(count) + " so far)");
  ++auth_refused;  // after the log line: whoever sees the count finds the line
}

void SocketLoop::Impl::drain_outbox() {
  std::deque<Command> batch;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch.swap(outbox);
  }
  for (Command& c : batch) {
    if (c.kind == Command::kSend) {
      write(c.socket, c.peer, std::move(c.body));
    } else if (c.kind == Command::kFlush) {
      for (auto& socket : sockets)
        if (socket) socket->set(zmq::sockopt::linger, c.linger_ms);
      c.flushed->set_value();
    } else if (specs[c.socket].role == SocketOptions::Role::kClient) {
      log(name(c.socket) + ": reconnecting to " + specs[c.socket].endpoint);
      sockets[c.socket].reset();
      sockets[c.socket] = open(c.socket);
    }
  }
}

SocketLoop::SocketLoop(LoopOptions options) : options_(std::move(options)), impl_(new Impl(options_)) {
  if (options_.tick_interval.count() <= 0)
    throw std::invalid_argument("SocketLoop: tick_interval must be > 0");
  if (options_.max_frame_bytes == 0) throw std::invalid_argument("SocketLoop: max_frame_bytes must be > 0");
}

SocketLoop::~SocketLoop() { stop(); }

SocketId SocketLoop::add_socket(SocketOptions options) {
  if (impl_->thread.joinable()) throw std::logic_error("SocketLoop: add_socket after start");
  validate(options);
  const SocketId id = static_cast<SocketId>(impl_->specs.size());
  if (options.curve_server) {
    impl_->zap.allow(zap_domain(id), options.curve_server->allowed_clients);
    impl_->needs_zap = true;
  }
  impl_->specs.push_back(std::move(options));
  impl_->endpoints.push_back(impl_->specs.back().endpoint);
  return id;
}

void SocketLoop::on_frame(FrameHandler handler) { impl_->frame_handler = std::move(handler); }
void SocketLoop::on_tick(TickHandler handler) { impl_->tick_handler = std::move(handler); }
void SocketLoop::on_undeliverable(UndeliverableHandler handler) {
  impl_->undeliverable_handler = std::move(handler);
}

void SocketLoop::start() {
  if (impl_->thread.joinable()) throw std::logic_error("SocketLoop: started twice");
  std::promise<void> started;
  auto ready = started.get_future();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->running = true;
  }
  // The promise moves into the thread, so nothing of it is left here once get() returns.
  impl_->thread = std::thread([this, p = std::move(started)]() mutable { impl_->run(p); });
  try {
    ready.get();
  } catch (...) {
    impl_->thread.join();
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->running = false;
    throw;
  }
}

std::string SocketLoop::endpoint(SocketId socket) const { return impl_->endpoints.at(socket); }

bool SocketLoop::send(SocketId socket, std::string peer, std::string body) {
  if (socket < 0 || socket >= static_cast<SocketId>(impl_->specs.size())) {
    log("send: no socket " + std::to_string(socket));
    return false;
  }
  if (body.size() > options_.max_frame_bytes) {
    if (impl_->oversize_log.allow())
      log(impl_->name(socket) + ": not sending a frame of " + std::to_string(body.size()) +
          " bytes: over the limit of " + std::to_string(options_.max_frame_bytes));
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (!impl_->running) return false;
    if (options_.max_outbox && impl_->outbox.size() >= options_.max_outbox) {
      ++impl_->undeliverable;
      if (impl_->undeliverable_log.allow()) log(impl_->name(socket) + ": outbox full, frame dropped");
      return false;
    }
    impl_->outbox.push_back({Impl::Command::kSend, socket, std::move(peer), std::move(body)});
  }
  const uint64_t one = 1;
  (void)!::write(impl_->wakeup, &one, sizeof one);
  return true;
}

bool SocketLoop::send_message(SocketId socket, std::string peer, const Message& message) {
  return send(socket, std::move(peer), encode(message));
}

void SocketLoop::reconnect(SocketId socket) {
  if (socket < 0 || socket >= static_cast<SocketId>(impl_->specs.size())) {
    log("reconnect: no socket " + std::to_string(socket));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (!impl_->running) return;
    impl_->outbox.push_back({Impl::Command::kReconnect, socket, {}, {}});
  }
  const uint64_t one = 1;
  (void)!::write(impl_->wakeup, &one, sizeof one);
}

bool SocketLoop::flush(std::chrono::milliseconds timeout) {
  auto flushed = std::make_shared<std::promise<void>>();
  std::future<void> done = flushed->get_future();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (!impl_->running) return false;
    Impl::Command c;
    c.kind = Impl::Command::kFlush;
    c.flushed = flushed;
    c.linger_ms = static_cast<int>(timeout.count());
    impl_->outbox.push_back(std::move(c));
  }
  const uint64_t one = 1;
  (void)!::write(impl_->wakeup, &one, sizeof one);
  return done.wait_for(timeout) == std::future_status::ready;
}

LoopStats SocketLoop::stats() const {
  const Impl& i = *impl_;
  return {i.frames_in,     i.bytes_in,      i.frames_out,    i.bytes_out,   i.oversize,
          i.bad_envelopes, i.undeliverable, i.auth_accepted, i.auth_refused};
}

void SocketLoop::log(const std::string& line) const { impl_->log(line); }

std::string SocketLoop::name(SocketId socket) const { return impl_->name(socket); }

void SocketLoop::stop() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->running = false;
  }
  if (impl_->thread.joinable()) {
    impl_->ctx.shutdown();  // every zmq call on the loop thread now fails with ETERM
    impl_->thread.join();   // it closes its sockets on the way out
  }
  impl_->ctx.close();
}

}  // namespace troupe::transport
