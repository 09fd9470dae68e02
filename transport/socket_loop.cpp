#include "transport/socket_loop.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "transport/log_throttle.hpp"
#include "transport/socket_backlog.hpp"
#include "transport/socket_open.hpp"
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
  LaggingHandler lagging_handler;
  SocketEventHandler event_handler;
  ZapHandler zap;
  bool needs_zap = false;

  std::mutex mutex;                     // guards outbox, running and loop_thread
  std::condition_variable outbox_room;  // the loop thread took the outbox, or stopped
  std::deque<Command> outbox;
  bool running = false;
  std::thread::id loop_thread;
  const int wakeup;  // eventfd: senders add 1 after queueing, the loop reads it to 0
  std::thread thread;

  std::atomic<uint64_t> frames_in{0}, bytes_in{0}, frames_out{0}, bytes_out{0}, oversize{0}, bad_envelopes{0},
      undeliverable{0}, auth_accepted{0}, auth_refused{0}, backlogged_frames{0}, backlogged_bytes{0},
      peers_cut{0}, cut_frames{0}, outbox_waits{0}, handshake_failures{0};
  LogThrottle oversize_log, envelope_log, undeliverable_log, auth_log, handler_log, backlog_log,
      handshake_log;

  // Loop thread only.
  std::vector<OpenSocket> slots;
  std::vector<SocketBacklog> backlogs;  // one per socket; only server sockets fill theirs
  std::vector<std::shared_ptr<std::promise<void>>>
      flushes;  // flush() calls waiting for the backlogs to empty
  std::unique_ptr<zmq::socket_t> zap_socket;
  int monitors_opened = 0;  // numbers the monitors' inproc endpoints

  void log(const std::string& line) const {
    if (options.log)
      options.log("transport: " + line);
    else
      std::cerr << "transport: " + line + "\n" << std::flush;
  }
  const std::string& name(SocketId id) const {
    return specs[id].name.empty() ? specs[id].endpoint : specs[id].name;
  }
  bool is_server(SocketId id) const { return specs[id].role == SocketOptions::Role::kServer; }

  // Runs one of the program's handlers; what it throws is logged, not passed on.
  template <typename Handler, typename... Args>
  void call(const char* what, const Handler& handler, Args&&... args) {
    if (!handler) return;
    try {
      handler(std::forward<Args>(args)...);
    } catch (const std::exception& e) {
      if (handler_log.allow()) log(std::string(what) + " threw: " + e.what());
    }
  }

  // Any thread. False when the loop is not running.
  bool enqueue(Command&& c) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!running) return false;
      outbox.push_back(std::move(c));
    }
    wake();
    return true;
  }
  void wake() const {
    const uint64_t one = 1;
    (void)!::write(wakeup, &one, sizeof one);
  }

  OpenSocket open(SocketId id) {
    const size_t cut =
        options.disconnect_frame_bytes ? options.disconnect_frame_bytes : 2 * options.max_frame_bytes;
    return open_socket(ctx, id, specs[id], cut,
                       "inproc://troupe-monitor-" + std::to_string(++monitors_opened));
  }

  void run(std::promise<void>& started);
  void poll_forever();
  void read_socket(SocketId id);
  void on_message(SocketId id, std::vector<zmq::message_t>& parts, size_t dropped_parts);
  void read_monitor(SocketId id);
  void on_event(SocketId id, const SocketEvent& event, bool refused_by_zap);
  void write(SocketId id, const std::string& peer, std::string&& body);
  SocketBacklog::Sent send_to_peer(SocketId id, const std::string& peer, std::string& body);
  void cut(SocketId id, const std::string& peer);
  void retry_backlogs();
  void reply_error(SocketId id, const std::string& peer, ErrorCode code, const std::string& message);
  void dropped(SocketId id, const std::string& peer, const std::string& why, size_t frames = 1);
  void serve_zap();
  void drain_outbox();
};

void SocketLoop::Impl::run(std::promise<void>& started) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    loop_thread = std::this_thread::get_id();
  }
  try {
    if (needs_zap) {
      // The ZAP handler must be bound before any CURVE server socket exists (RFC 27).
      zap_socket = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::rep);
      zap_socket->set(zmq::sockopt::linger, 0);
      zap_socket->bind(ZapHandler::kEndpoint);
    }
    for (SocketId id = 0; id < static_cast<SocketId>(specs.size()); ++id) {
      try {
        slots.push_back(open(id));
      } catch (const zmq::error_t& e) {
        throw std::runtime_error("socket " + name(id) + ": cannot " +
                                 (is_server(id) ? "bind " : "connect to ") + specs[id].endpoint + ": " +
                                 e.what());
      }
      endpoints[id] =
          is_server(id) ? slots.back().socket->get(zmq::sockopt::last_endpoint) : specs[id].endpoint;
    }
  } catch (...) {
    slots.clear();  // linger 0: closes at once
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
    outbox.clear();  // a flush() still waiting gets a broken promise
  }
  outbox_room.notify_all();
  flushes.clear();
  slots.clear();
  zap_socket.reset();
}

void SocketLoop::Impl::poll_forever() {
  const auto tick = options.tick_interval;
  auto next_tick = Clock::now() + tick;
  std::vector<zmq::pollitem_t> items;
  for (;;) {
    items.clear();
    if (zap_socket) items.push_back({zap_socket->handle(), 0, ZMQ_POLLIN, 0});
    for (auto& s : slots) items.push_back({s.socket->handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({nullptr, wakeup, ZMQ_POLLIN, 0});

    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - Clock::now());
    wait = std::max(std::chrono::milliseconds(0), std::min(wait, tick));
    zmq::poll(items.data(), items.size(), wait);

    size_t k = 0;
    if (zap_socket && (items[k++].revents & ZMQ_POLLIN)) serve_zap();
    const auto n = static_cast<SocketId>(slots.size());
    for (SocketId id = 0; id < n; ++id)
      if (items[k++].revents & ZMQ_POLLIN) read_socket(id);
    if (items[k].revents & ZMQ_POLLIN) {
      uint64_t count = 0;
      (void)!::read(wakeup, &count, sizeof count);  // to 0 before the swap: a later send wakes the next poll
      drain_outbox();
    }
    retry_backlogs();  // every wakeup, ticks included
    const auto now = Clock::now();
    if (now >= next_tick) {
      next_tick = now + tick;
      // Socket events (handshakes, connections) are read once a tick, not in
      // the poll set: each socket polled costs every wakeup a few syscalls,
      // and an event a tick late is soon enough for a log line or a client
      // that gives up on a failed handshake.
      for (SocketId id = 0; id < n; ++id) read_monitor(id);
      call("on_tick", tick_handler, now);
    }
  }
}

void SocketLoop::Impl::read_socket(SocketId id) {
  zmq::socket_t& s = *slots[id].socket;
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
  const bool server = is_server(id);
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
  call("on_frame", frame_handler, Frame{id, peer, body.to_string()});
}

void SocketLoop::Impl::read_monitor(SocketId id) {
  zmq::socket_t& m = *slots[id].monitor;
  const bool curve = specs[id].curve_server || specs[id].curve_client;
  for (int n = 0; n < kMaxReadsPerWakeup; ++n) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(m, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    // libzmq's version 1 event: [uint16 event, uint32 value] (host order), then the endpoint.
    if (parts.size() != 2 || parts[0].size() != 6) continue;
    uint16_t event = 0;
    uint32_t value = 0;
    std::memcpy(&event, parts[0].data(), sizeof event);
    std::memcpy(&value, parts[0].data<char>() + sizeof event, sizeof value);
    if (auto e = socket_event(event, value, parts[1].to_string(), is_server(id), curve))
      on_event(id, *e, event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  }
}

void SocketLoop::Impl::on_event(SocketId id, const SocketEvent& event, bool refused_by_zap) {
  if (event.kind == SocketEvent::kHandshakeFailed) {
    uint64_t count = 0;
    const bool server = is_server(id);
    // serve_zap logged a server's refusal already, with the client's key and address.
    if (!(server && refused_by_zap) && handshake_log.allow(&count))
      log(name(id) +
          (server
               ? ": a client's handshake failed at " + event.address + " (libzmq names no client address): "
               : ": handshake with " + event.address + " failed: ") +
          event.reason + " (" + std::to_string(count) + " so far)");
    ++handshake_failures;  // after the log line: whoever sees the count finds the line
  }
  call("on_socket_event", event_handler, id, event);
}

void SocketLoop::Impl::reply_error(SocketId id, const std::string& peer, ErrorCode code,
                                   const std::string& message) {
  write(id, peer, encode(Error{code, message, std::nullopt}));
}

void SocketLoop::Impl::dropped(SocketId id, const std::string& peer, const std::string& why, size_t frames) {
  undeliverable += frames;
  uint64_t count = 0;
  if (undeliverable_log.allow(&count))
    log(name(id) + ": " + (frames == 1 ? "frame" : std::to_string(frames) + " frames") +
        " for peer=" + hex(peer) + " dropped: " + why + " (" + std::to_string(count) + " so far)");
  call("on_undeliverable", undeliverable_handler, id, peer);
}

void SocketLoop::Impl::write(SocketId id, const std::string& peer, std::string&& body) {
  if (!is_server(id)) {
    const size_t size = body.size();
    try {
      if (!slots[id].socket->send(to_message(std::move(body)), zmq::send_flags::dontwait))
        return dropped(id, peer, "the queue to the server is full");
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) throw;
      return dropped(id, peer, e.what());
    }
    ++frames_out;
    bytes_out += size;
    return;
  }
  SocketBacklog& backlog = backlogs[id];
  if (!backlog.holds(peer)) {
    const SocketBacklog::Sent sent = send_to_peer(id, peer, body);
    if (sent == SocketBacklog::Sent::kSent) return;
    if (sent == SocketBacklog::Sent::kGone) return dropped(id, peer, "the peer is gone");
  }
  if (backlog.push(peer, std::move(body)) == SocketBacklog::Pushed::kCut) cut(id, peer);
}

SocketBacklog::Sent SocketLoop::Impl::send_to_peer(SocketId id, const std::string& peer, std::string& body) {
  zmq::socket_t& s = *slots[id].socket;
  try {
    if (!s.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return SocketBacklog::Sent::kWouldBlock;
    const size_t size = body.size();
    s.send(to_message(std::move(body)), zmq::send_flags::dontwait);  // parts after the first never block
    ++frames_out;
    bytes_out += size;
    return SocketBacklog::Sent::kSent;
  } catch (const zmq::error_t& e) {
    if (e.num() == ETERM) throw;
    if (e.num() != EHOSTUNREACH && undeliverable_log.allow())
      log(name(id) + ": sending to peer=" + hex(peer) + ": " + e.what());
    return SocketBacklog::Sent::kGone;
  }
}

void SocketLoop::Impl::cut(SocketId id, const std::string& peer) {
  uint64_t count = 0;
  if (backlog_log.allow(&count))
    log(name(id) + ": peer=" + hex(peer) + " is too slow: its backlog is full (" +
        std::to_string(options.max_peer_backlog_frames) + " frames / " +
        std::to_string(options.max_peer_backlog_bytes) +
        " bytes); it gets a last frame and nothing more until it has read what waits (" +
        std::to_string(count) + " so far)");
  call("on_lagging", lagging_handler, id, peer);
  if (!options.lagging_farewell) return;
  try {
    backlogs[id].add_farewell(peer, options.lagging_farewell(id, peer));
  } catch (const std::exception& e) {
    if (handler_log.allow()) log(std::string("lagging_farewell threw: ") + e.what());
  }
}

void SocketLoop::Impl::retry_backlogs() {
  uint64_t frames = 0, bytes = 0, cuts = 0, cut_dropped = 0;
  for (SocketId id = 0; id < static_cast<SocketId>(backlogs.size()); ++id) {
    SocketBacklog& backlog = backlogs[id];
    const SocketBacklog::Retried r = backlog.retry(
        [&](const std::string& peer, std::string& body) { return send_to_peer(id, peer, body); });
    for (const auto& [peer, lost] : r.gone) dropped(id, peer, "the peer is gone", lost);
    for (const std::string& peer : r.whole)
      if (backlog_log.allow()) log(name(id) + ": peer=" + hex(peer) + " has caught up: it gets frames again");
    frames += backlog.frames();
    bytes += backlog.bytes();
    cuts += backlog.peers_cut();
    cut_dropped += backlog.cut_frames();
  }
  backlogged_frames = frames;
  backlogged_bytes = bytes;
  peers_cut = cuts;
  cut_frames = cut_dropped;
  if (frames == 0) {
    for (auto& f : flushes) f->set_value();
    flushes.clear();
  }
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
  std::string socket = "?";
  for (SocketId id = 0; id < static_cast<SocketId>(specs.size()); ++id)
    if (request.size() > 2 && request[2] == zap_domain(id)) socket = name(id);
  uint64_t count = 0;
  if (auth_log.allow(&count))
    log(socket + ": refused CurveZMQ client key=" + (d.client_key.empty() ? "-" : d.client_key) +
        " address=" + d.address + ": " + d.reason + " (" + std::to_string(count) + " so far)");
  ++auth_refused;  // after the log line: whoever sees the count finds the line
}

void SocketLoop::Impl::drain_outbox() {
  std::deque<Command> batch;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch.swap(outbox);
  }
  outbox_room.notify_all();
  for (Command& c : batch) {
    if (c.kind == Command::kSend) {
      write(c.socket, c.peer, std::move(c.body));
    } else if (c.kind == Command::kFlush) {
      for (auto& slot : slots) slot.socket->set(zmq::sockopt::linger, c.linger_ms);
      flushes.push_back(std::move(c.flushed));  // set by retry_backlogs once no backlog holds a frame
    } else if (!is_server(c.socket)) {
      log(name(c.socket) + ": reconnecting to " + specs[c.socket].endpoint);
      slots[c.socket].close();  // before the new one opens: frees its address and monitor
      slots[c.socket] = open(c.socket);
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
  impl_->backlogs.emplace_back(
      BacklogLimits{options_.max_peer_backlog_frames, options_.max_peer_backlog_bytes});
  return id;
}

void SocketLoop::on_frame(FrameHandler handler) { impl_->frame_handler = std::move(handler); }
void SocketLoop::on_tick(TickHandler handler) { impl_->tick_handler = std::move(handler); }
void SocketLoop::on_undeliverable(UndeliverableHandler handler) {
  impl_->undeliverable_handler = std::move(handler);
}
void SocketLoop::on_lagging(LaggingHandler handler) { impl_->lagging_handler = std::move(handler); }
void SocketLoop::on_socket_event(SocketEventHandler handler) { impl_->event_handler = std::move(handler); }

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
  bool waited = false;
  {
    std::unique_lock<std::mutex> lock(impl_->mutex);
    const auto room = [&] {
      return !impl_->running || !options_.max_outbox || impl_->outbox.size() < options_.max_outbox;
    };
    // The loop thread cannot wait for itself to drain the outbox.
    waited = !room() && options_.outbox_wait.count() > 0 && std::this_thread::get_id() != impl_->loop_thread;
    if (waited) {
      ++impl_->outbox_waits;
      impl_->outbox_room.wait_for(lock, options_.outbox_wait, room);
    }
    if (!impl_->running) return false;
    if (room()) {
      // Only the first frame into an empty outbox wakes the loop: it takes
      // the whole outbox at once, and a frame pushed after it took it finds
      // the outbox empty again (the check and the swap share the mutex).
      const bool first = impl_->outbox.empty();
      impl_->outbox.push_back({Impl::Command::kSend, socket, std::move(peer), std::move(body)});
      lock.unlock();
      if (first) impl_->wake();
      return true;
    }
  }
  ++impl_->undeliverable;
  if (impl_->undeliverable_log.allow())
    log(impl_->name(socket) + ": outbox full (" + std::to_string(options_.max_outbox) + " frames)" +
        (waited ? " for " + std::to_string(options_.outbox_wait.count()) + " ms" : "") + ": frame dropped");
  return false;
}

bool SocketLoop::send_message(SocketId socket, std::string peer, const Message& message) {
  return send(socket, std::move(peer), encode(message));
}

void SocketLoop::reconnect(SocketId socket) {
  if (socket < 0 || socket >= static_cast<SocketId>(impl_->specs.size())) {
    log("reconnect: no socket " + std::to_string(socket));
    return;
  }
  impl_->enqueue({Impl::Command::kReconnect, socket, {}, {}});
}

bool SocketLoop::flush(std::chrono::milliseconds timeout) {
  auto flushed = std::make_shared<std::promise<void>>();
  std::future<void> done = flushed->get_future();
  Impl::Command c;
  c.kind = Impl::Command::kFlush;
  c.flushed = std::move(flushed);
  c.linger_ms = static_cast<int>(timeout.count());
  if (!impl_->enqueue(std::move(c))) return false;
  if (done.wait_for(timeout) != std::future_status::ready) return false;
  try {
    done.get();
    return true;
  } catch (const std::future_error&) {
    return false;  // the loop ended first
  }
}

LoopStats SocketLoop::stats() const {
  const Impl& i = *impl_;
  LoopStats s;
  s.frames_in = i.frames_in;
  s.bytes_in = i.bytes_in;
  s.frames_out = i.frames_out;
  s.bytes_out = i.bytes_out;
  s.oversize = i.oversize;
  s.bad_envelopes = i.bad_envelopes;
  s.undeliverable = i.undeliverable;
  s.auth_accepted = i.auth_accepted;
  s.auth_refused = i.auth_refused;
  s.backlogged_frames = i.backlogged_frames;
  s.backlogged_bytes = i.backlogged_bytes;
  s.peers_cut = i.peers_cut;
  s.cut_frames = i.cut_frames;
  s.outbox_waits = i.outbox_waits;
  s.handshake_failures = i.handshake_failures;
  return s;
}

void SocketLoop::log(const std::string& line) const { impl_->log(line); }

std::string SocketLoop::name(SocketId socket) const { return impl_->name(socket); }

void SocketLoop::stop() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->running = false;
  }
  impl_->outbox_room.notify_all();
  if (impl_->thread.joinable()) {
    impl_->ctx.shutdown();  // every zmq call on the loop thread now fails with ETERM
    impl_->thread.join();   // it closes its sockets on the way out
  }
  impl_->ctx.close();
}

}  // namespace troupe::transport
