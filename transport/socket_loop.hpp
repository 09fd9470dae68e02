#pragma once
// SocketLoop: one thread that owns a process's ZeroMQ sockets and moves
// frames between them and the rest of the program (the actors).
//
//   any thread ── send() ──▶ outbox (mutex + eventfd) ──▶ ┌─────────────┐ ──▶ peers
//                                                        │ loop thread │
//   on_frame(Frame&&) ◀── (called on the loop thread) ◀── │ zmq_poll    │ ◀── peers
//   on_tick(now)      ◀── every tick_interval ◀────────── └─────────────┘
//
// Rules it keeps (ZeroMQ guide; caf-0.17 notes §11):
// - A socket is touched only by the loop thread: sockets are created, bound
//   and connected in start() on that thread, closed by it when it ends.
// - Other threads hand frames over through the outbox. Why a mutex-guarded
//   queue with an eventfd in the poll set rather than an inproc PAIR: the
//   senders are CAF actors that migrate between scheduler threads, so none
//   can own a socket of its own, and a shared PAIR would need a lock anyway;
//   the queue needs no socket per sender and is drained whole per wakeup.
// - linger = 0; polls wait at most until the next tick, never forever.
// - stop(): ctx.shutdown() (every zmq call on the loop thread returns ETERM)
//   -> join the thread (it closes its sockets) -> ctx.close() (which waits
//   for queued frames up to the linger that flush() set).
// - Handlers run on the loop thread and must not block (anon_send is fine)
//   nor call stop(); an exception from a handler is logged and the loop
//   goes on. Frames still queued when the loop stops are dropped (linger 0)
//   unless flush() came first.
//
// Server sockets are ROUTERs that bind (peers are told apart by the identity
// frame ZeroMQ adds); client sockets are DEALERs that connect and reconnect
// by themselves with backoff, keeping their identity (a random 16 bytes)
// across those reconnects; reconnect() starts over with a new socket and a
// new identity. With CurveZMQ every frame is encrypted and a
// ZAP handler on the loop thread admits only the allowed client keys.
// Frames over max_frame_bytes are answered with an `error` frame
// (too_large) and go no further; frames past disconnect_frame_bytes make
// libzmq drop the connection (ZMQ_MAXMSGSIZE) before they are read.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/liveness.hpp"
#include "transport/protocol.hpp"
#include "transport/socket_options.hpp"

namespace troupe::transport {

struct LoopOptions {
  size_t max_frame_bytes = kDefaultMaxFrameBytes;  // bodies over this get an `error` (too_large) reply
  size_t disconnect_frame_bytes = 0;  // frames over this drop the connection; 0 = 2 x max_frame_bytes
  std::chrono::milliseconds tick_interval{100};  // on_tick period and longest poll wait; > 0
  size_t max_outbox = 100000;  // frames queued by send() not yet sent; past it send() refuses
  std::function<void(const std::string&)> log;  // one line per event; empty = stderr
};

// One frame that arrived.
struct Frame {
  SocketId socket = 0;
  std::string peer;  // ROUTER identity of the sender; empty on a client socket
  std::string body;  // at most max_frame_bytes
};

// Counters since start (read from any thread).
struct LoopStats {
  uint64_t frames_in = 0, bytes_in = 0;          // handed to on_frame (bodies)
  uint64_t frames_out = 0, bytes_out = 0;        // written to a socket (bodies)
  uint64_t oversize = 0;                         // answered too_large
  uint64_t bad_envelopes = 0;                    // not exactly one body frame
  uint64_t undeliverable = 0;                    // sends dropped: peer gone, queue full, loop stopping
  uint64_t auth_accepted = 0, auth_refused = 0;  // CurveZMQ handshakes decided by the ZAP handler
};

class SocketLoop {
 public:
  using FrameHandler = std::function<void(Frame&&)>;
  using TickHandler = std::function<void(Clock::time_point now)>;
  // A frame for `peer` was dropped (the peer is gone, or its queue is full).
  using UndeliverableHandler = std::function<void(SocketId, const std::string& peer)>;

  explicit SocketLoop(LoopOptions options = {});
  ~SocketLoop();  // stop()
  SocketLoop(const SocketLoop&) = delete;
  SocketLoop& operator=(const SocketLoop&) = delete;

  // Before start().
  SocketId add_socket(SocketOptions options);
  void on_frame(FrameHandler handler);
  void on_tick(TickHandler handler);
  void on_undeliverable(UndeliverableHandler handler);

  // Opens every socket on the loop thread and runs it. Throws (and runs
  // nothing) when a socket cannot be opened: std::invalid_argument for
  // options that cannot work (keys, an unsafe endpoint: see
  // check_bind_security), std::runtime_error for the environment (address
  // in use).
  void start();
  // The endpoint a server socket bound, its port resolved ("tcp://127.0.0.1:41234").
  std::string endpoint(SocketId socket) const;

  // Any thread. Queues a frame for `peer` (ignored on a client socket).
  // False, with a log line, when the loop is not running, the outbox is
  // full, or the body is over max_frame_bytes (the peer would refuse it).
  bool send(SocketId socket, std::string peer, std::string body);
  bool send_message(SocketId socket, std::string peer, const Message& message);
  // Any thread. Closes a client socket, dropping what it still queues, and
  // connects a fresh one (Paranoid Pirate's reconnect after a lost peer).
  void reconnect(SocketId socket);

  LoopStats stats() const;
  size_t max_frame_bytes() const { return options_.max_frame_bytes; }
  std::string name(SocketId socket) const;  // its options' name, else its endpoint
  void log(const std::string& line) const;

  // Any thread. Before stop(), for a last word: waits until every frame
  // queued by send() before the call has been handed to its socket, and lets
  // the sockets linger up to `timeout` when stop() closes them, so those
  // frames can still leave. False when the loop is not running or the
  // outbox did not drain within `timeout`.
  bool flush(std::chrono::milliseconds timeout);

  // Idempotent; after it, send() refuses.
  void stop();

 private:
  struct Impl;
  LoopOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::transport
