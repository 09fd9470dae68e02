#pragma once
// How a SocketLoop opens one socket: a ROUTER or DEALER with the ZeroMQ
// options its SocketOptions call for, its libzmq monitor, then bound or
// connected. Loop thread only (the sockets belong to it).
#include <memory>
#include <string>

#include <zmq.hpp>

#include "transport/socket_options.hpp"

namespace troupe::transport {

// A socket and the PAIR that reads its monitor events, closed in the one safe
// order: monitoring stopped, then the socket, then the reader. libzmq 4.3
// sends monitor events from its I/O thread with a blocking send; a reader
// closed while the socket still had an event to report (a connection being
// torn down) left that send waiting for a peer for ever, and with it every
// socket of the context: a node that reconnected after a pause never opened
// its new connection (the chaos suite's "n2 never rejoined").
struct OpenSocket {
  OpenSocket() = default;
  OpenSocket(OpenSocket&& other) noexcept = default;
  OpenSocket& operator=(OpenSocket&& other) noexcept {
    if (this != &other) {
      close();
      socket = std::move(other.socket);
      monitor = std::move(other.monitor);
    }
    return *this;
  }
  OpenSocket(const OpenSocket&) = delete;
  OpenSocket& operator=(const OpenSocket&) = delete;
  ~OpenSocket() { close(); }
  void close() noexcept;

  std::unique_ptr<zmq::socket_t> socket;
  std::unique_ptr<zmq::socket_t> monitor;  // a PAIR that gets the socket's monitor events (socket_event.hpp)
};

// The ZAP domain of a CurveZMQ server socket: its own allowed keys.
std::string zap_domain(SocketId id);

// Throws zmq::error_t when libzmq refuses (an address in use). The monitor
// listens at `monitor_endpoint` (inproc, unique in `ctx`), and is set up
// before the socket binds or connects, so that no event is lost.
// `max_message_bytes`: ZMQ_MAXMSGSIZE, past which libzmq drops the connection.
OpenSocket open_socket(zmq::context_t& ctx, SocketId id, const SocketOptions& options,
                       size_t max_message_bytes, const std::string& monitor_endpoint);

}  // namespace troupe::transport
