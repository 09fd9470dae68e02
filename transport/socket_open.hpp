#pragma once
// How a SocketLoop opens one socket: a ROUTER or DEALER with the ZeroMQ
// options its SocketOptions call for, its libzmq monitor, then bound or
// connected. Loop thread only (the sockets belong to it).
#include <memory>
#include <string>

#include <zmq.hpp>

#include "transport/socket_options.hpp"

namespace troupe::transport {

struct OpenSocket {
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
