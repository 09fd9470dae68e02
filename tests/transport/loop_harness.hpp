#pragma once
// Helpers for tests that run SocketLoops over real TCP on loopback with
// ephemeral ports. Waits are generous (a loaded machine); nothing asserts how
// long anything took.
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/dispatch.hpp"
#include "transport/inbox.hpp"
#include "transport/socket_loop.hpp"

namespace troupe::transport::test {

inline constexpr std::chrono::milliseconds kPatience{
    20000};  // how long a test waits for something that must come

// Polls `done` every millisecond until it holds or kPatience passes.
inline bool wait_until(const std::function<bool()>& done) {
  const auto deadline = Clock::now() + kPatience;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

struct Received {
  SocketId socket;
  std::string peer;
  Message message;
};

// Log lines of a loop, kept for assertions.
struct LogLines {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& l) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(l);
    };
  }
  bool contains(const std::string& s) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }
};

// The SocketEvents of a loop, kept for assertions.
struct EventLog {
  struct Seen {
    SocketId socket;
    SocketEvent event;
  };
  std::mutex mutex;
  std::vector<Seen> seen;
  SocketLoop::SocketEventHandler sink() {
    return [this](SocketId s, const SocketEvent& e) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back({s, e});
    };
  }
  // The first event of `kind` on `socket`, waiting for it up to kPatience.
  std::optional<SocketEvent> first(SocketEvent::Kind kind, SocketId socket = 0) {
    std::optional<SocketEvent> found;
    wait_until([&] {
      std::lock_guard<std::mutex> lock(mutex);
      for (const Seen& s : seen)
        if (s.socket == socket && s.event.kind == kind) found = s.event;
      return found.has_value();
    });
    return found;
  }
  std::vector<SocketEvent::Kind> kinds(SocketId socket = 0) {
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<SocketEvent::Kind> out;
    for (const Seen& s : seen)
      if (s.socket == socket) out.push_back(s.event.kind);
    return out;
  }
};

// A loop with one socket whose decoded messages land in `inbox`.
struct Endpoint {
  explicit Endpoint(SocketOptions socket, LoopOptions options = {})
      : loop((options.log = logs.sink(), options)) {
    id = loop.add_socket(std::move(socket));
    loop.on_frame(decode_frames(loop, [this](SocketId s, const std::string& peer, Message&& m) {
      inbox.push({s, peer, std::move(m)});
    }));
    loop.on_socket_event(events.sink());
  }
  // The loop thread pushes into `inbox`: stop it before the members go.
  ~Endpoint() { loop.stop(); }
  // The next message, or a failed test.
  Message next() {
    auto r = inbox.pop(kPatience);
    if (!r) throw std::runtime_error("no message within the test's patience");
    last_peer = r->peer;
    return std::move(r->message);
  }
  LogLines logs;
  EventLog events;
  SocketLoop loop;
  SocketId id = 0;
  Inbox<Received> inbox;
  std::string last_peer;
};

inline SocketOptions server_on_loopback() {
  SocketOptions o;
  o.role = SocketOptions::Role::kServer;
  o.endpoint = "tcp://127.0.0.1:*";
  o.name = "server";
  return o;
}

inline SocketOptions client_of(const std::string& endpoint) {
  SocketOptions o;
  o.role = SocketOptions::Role::kClient;
  o.endpoint = endpoint;
  o.name = "client";
  return o;
}

// A raw DEALER owned by the test thread, for sending what SocketLoop never
// would, and for reading slowly: a small `recv_hwm` and `recv_buffer`
// (SO_RCVBUF, bytes; -1 = the kernel's) make the server's queue fill soon.
struct RawClient {
  explicit RawClient(const std::string& endpoint, int recv_hwm = 1000, int recv_buffer = -1)
      : socket(ctx, zmq::socket_type::dealer) {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::rcvtimeo, static_cast<int>(kPatience.count()));
    socket.set(zmq::sockopt::rcvhwm, recv_hwm);
    socket.set(zmq::sockopt::rcvbuf, recv_buffer);
    socket.connect(endpoint);
  }
  void send(const std::string& body) { socket.send(zmq::buffer(body), zmq::send_flags::none); }
  void send_parts(const std::vector<std::string>& parts) {
    std::vector<zmq::const_buffer> b;
    for (const auto& p : parts) b.push_back(zmq::buffer(p));
    zmq::send_multipart(socket, b);
  }
  // The next frame as it came; throws when none comes.
  std::string receive_body() {
    zmq::message_t m;
    if (!socket.recv(m)) throw std::runtime_error("raw client: nothing received");
    return m.to_string();
  }
  // The next frame, decoded; throws when none comes.
  Message receive() {
    Decoded d = decode(receive_body());
    if (!d.ok()) throw std::runtime_error("raw client: undecodable reply: " + d.error.message);
    return *d.message;
  }
  zmq::context_t ctx{1};
  zmq::socket_t socket;
};

}  // namespace troupe::transport::test
