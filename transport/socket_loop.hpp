#pragma once
// SocketLoop: one thread that owns a process's ZeroMQ sockets and moves
// frames between them and the rest of the program (the actors).
//
//   any thread ── send() ──▶ outbox (mutex + eventfd) ──▶ ┌─────────────┐ ──▶ peers
//                                                        │ loop thread │
//   on_frame(Frame&&) ◀── (called on the loop thread) ◀── │ zmq_poll    │ ◀── peers
//   on_tick(now)      ◀── every tick_interval ◀────────── └─────────────┘
//   on_socket_event   ◀── each socket's monitor (inproc PAIR, read every tick)
//
// Rules it keeps (ZeroMQ guide; caf-0.17 notes §11):
// - A socket is touched only by the loop thread: sockets are created, bound
//   and connected in start() on that thread, closed by it when it ends.
// - Other threads hand frames over through the outbox. Why a mutex-guarded
//   queue with an eventfd in the poll set rather than an inproc PAIR: the
//   senders are CAF actors that migrate between scheduler threads, so none
//   can own a socket of its own, and a shared PAIR would need a lock anyway;
//   the queue needs no socket per sender and is drained whole per wakeup.
// - The outbox holds at most max_outbox frames; a sender that finds it full
//   waits (up to outbox_wait) until the loop thread drains it.
// - linger = 0; polls wait at most until the next tick, never forever.
// - stop(): ctx.shutdown() (every zmq call on the loop thread returns ETERM)
//   -> join the thread (it closes its sockets) -> ctx.close() (which waits
//   for queued frames up to the linger that flush() set).
// - Handlers run on the loop thread and must not block (anon_send is fine)
//   nor call stop(); an exception from a handler is logged and the loop
//   goes on. Frames still queued when the loop stops, backlogs included, are
//   dropped (linger 0) unless flush() came first.
//
// Server sockets are ROUTERs that bind (peers are told apart by the identity
// frame ZeroMQ adds); client sockets are DEALERs that connect and reconnect
// by themselves with backoff, keeping their identity (a random 16 bytes)
// across those reconnects; reconnect() starts over with a new socket and a
// new identity. With CurveZMQ every frame is encrypted and a
// ZAP handler on the loop thread admits only the allowed client keys of
// each socket (its own ZAP domain). Frames over max_frame_bytes are answered
// with an `error` frame (too_large) and go no further; frames past
// disconnect_frame_bytes make libzmq drop the connection (ZMQ_MAXMSGSIZE)
// before they are read.
//
// A slow reader on a server socket (SocketBacklog's diagram):
// - Its ZeroMQ queue holds send_hwm frames. A frame that finds it full waits
//   in the peer's backlog, and every later frame for that peer waits behind
//   it: a connected peer loses nothing and gets everything in order.
//   Backlogs are retried on every wakeup and every tick (a ROUTER does not
//   say when a peer's queue has room again, so a lone backlogged peer gets
//   at most send_hwm frames per tick).
// - A frame that would take a backlog past max_peer_backlog_frames or
//   max_peer_backlog_bytes cuts its peer: that frame is dropped, on_lagging
//   is called once, the frame lagging_farewell returns is queued last (past
//   the bounds), and every later frame for the peer is dropped (stats:
//   cut_frames, the cutting frame included) until its backlog has been
//   sent; then it is an ordinary peer again.
// - A peer that is gone (ROUTER_MANDATORY: EHOSTUNREACH) loses its backlog;
//   on_undeliverable is called once for all of it.
// A client socket keeps no backlog: a frame that finds its queue full is
// dropped, logged and reported (on_undeliverable). Its one peer is the
// server, and a full queue means the server has stopped reading or is not
// there; the layer above already treats that silence as a lost peer (a node
// misses heartbeats, calls reconnect(), which drops the queue anyway, and
// registers again; `submit` gives up after --timeout), so a backlog would
// only hold frames for a connection about to be thrown away.
//
// Handshakes: each socket's libzmq monitor reports failed handshakes (and on
// a client the connection's life) to on_socket_event; failures are counted
// (stats: handshake_failures) and logged (throttled), so a client with the
// wrong keys can fail at once instead of waiting, and a server's log shows
// every client it turned away: with key and address when the ZAP handler
// refused it, else with the reason only (libzmq 4.3's monitor names no
// client address). socket_event.hpp: what libzmq reports in each case.
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
#include "transport/socket_event.hpp"
#include "transport/socket_options.hpp"

namespace troupe::transport {

struct LoopOptions {
  size_t max_frame_bytes = kDefaultMaxFrameBytes;  // bodies over this get an `error` (too_large) reply
  size_t disconnect_frame_bytes = 0;  // frames over this drop the connection; 0 = 2 x max_frame_bytes
  std::chrono::milliseconds tick_interval{100};  // on_tick period and longest poll wait; > 0
  size_t max_outbox = 100000;  // frames queued by send() not yet taken by the loop thread; 0 = no limit
  // How long send() waits for room in a full outbox before it refuses; 0 = refuses at once.
  std::chrono::milliseconds outbox_wait{2000};
  // Server sockets: frames waiting per peer behind its full ZeroMQ queue; past it the
  // peer is cut; 0 = no limit.
  size_t max_peer_backlog_frames = 10000;
  size_t max_peer_backlog_bytes = size_t{64} << 20;  // the same in body bytes; 0 = no limit
  // Loop thread: the body of the last frame a cut peer gets (an `error`); empty = no last frame.
  std::function<std::string(SocketId, const std::string& peer)> lagging_farewell;
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
  uint64_t undeliverable = 0;                    // frames dropped: peer gone, queue or outbox full
  uint64_t auth_accepted = 0, auth_refused = 0;  // CurveZMQ handshakes decided by the ZAP handler
  uint64_t backlogged_frames = 0;                // now waiting in server peers' backlogs
  uint64_t backlogged_bytes = 0;                 // their bodies
  uint64_t peers_cut = 0;                        // server peers cut for lagging
  uint64_t cut_frames = 0;                       // frames dropped for cut peers
  uint64_t outbox_waits = 0;                     // send() calls that found the outbox full and waited
  uint64_t handshake_failures = 0;               // failed handshakes seen by any socket's monitor
};

class SocketLoop {
 public:
  using FrameHandler = std::function<void(Frame&&)>;
  using TickHandler = std::function<void(Clock::time_point now)>;
  // Frames for `peer` were dropped: it is gone, or (client socket) its queue is full.
  using UndeliverableHandler = std::function<void(SocketId, const std::string& peer)>;
  // A server peer was cut for lagging (see above); once per cut.
  using LaggingHandler = std::function<void(SocketId, const std::string& peer)>;
  using SocketEventHandler = std::function<void(SocketId, const SocketEvent&)>;

  explicit SocketLoop(LoopOptions options = {});
  ~SocketLoop();  // stop()
  SocketLoop(const SocketLoop&) = delete;
  SocketLoop& operator=(const SocketLoop&) = delete;

  // Before start().
  SocketId add_socket(SocketOptions options);
  void on_frame(FrameHandler handler);
  void on_tick(TickHandler handler);
  void on_undeliverable(UndeliverableHandler handler);
  void on_lagging(LaggingHandler handler);
  void on_socket_event(SocketEventHandler handler);

  // Opens every socket on the loop thread and runs it. Throws (and runs
  // nothing) when a socket cannot be opened: std::invalid_argument for
  // options that cannot work (keys, an unsafe endpoint: see
  // check_bind_security), std::runtime_error for the environment (address
  // in use).
  void start();
  // The endpoint a server socket bound, its port resolved ("tcp://127.0.0.1:41234").
  std::string endpoint(SocketId socket) const;

  // Any thread. Queues a frame for `peer` (ignored on a client socket). When
  // the outbox is full it waits up to outbox_wait for room (on the loop
  // thread itself it cannot, and refuses at once). False, with a log line,
  // when the outbox stayed full; false at once when the loop is not running
  // or the body is over max_frame_bytes (the peer would refuse it).
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
  // queued by send() before the call has been handed to its socket and no
  // peer's backlog holds a frame, and lets the sockets linger up to
  // `timeout` when stop() closes them, so those frames can still leave.
  // False when the loop is not running or that did not happen within
  // `timeout`.
  bool flush(std::chrono::milliseconds timeout);

  // Idempotent; after it, send() refuses.
  void stop();

 private:
  struct Impl;
  LoopOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::transport
