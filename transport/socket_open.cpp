#include "transport/socket_open.hpp"

#include <mutex>
#include <random>

#include "transport/socket_event.hpp"

namespace troupe::transport {
namespace {

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

std::string zap_domain(SocketId id) { return "troupe-" + std::to_string(id); }

void OpenSocket::close() noexcept {
  if (socket) zmq_socket_monitor(socket->handle(), nullptr, 0);  // no event is sent after this
  socket.reset();
  monitor.reset();
}

OpenSocket open_socket(zmq::context_t& ctx, SocketId id, const SocketOptions& o, size_t max_message_bytes,
                       const std::string& monitor_endpoint) {
  const bool server = o.role == SocketOptions::Role::kServer;
  OpenSocket out;  // closes both in order if a step below throws
  out.socket = std::make_unique<zmq::socket_t>(ctx, server ? zmq::socket_type::router : zmq::socket_type::dealer);
  zmq::socket_t* s = out.socket.get();
  s->set(zmq::sockopt::linger, 0);
  s->set(zmq::sockopt::sndhwm, o.send_hwm);
  s->set(zmq::sockopt::rcvhwm, o.recv_hwm);
  s->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_message_bytes));
  if (o.tcp_heartbeat_ms > 0) {
    s->set(zmq::sockopt::heartbeat_ivl, o.tcp_heartbeat_ms);
    s->set(zmq::sockopt::heartbeat_timeout, 3 * o.tcp_heartbeat_ms);
  }
  if (zmq_socket_monitor(s->handle(), monitor_endpoint.c_str(), watched_events(server)) != 0)
    throw zmq::error_t();
  out.monitor = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
  out.monitor->set(zmq::sockopt::linger, 0);
  // No bound on the events waiting for the loop's next tick (inproc: a 0 on
  // either end makes the pipe unbounded): a full pipe would block libzmq's
  // I/O thread, and a flood of failing handshakes must not stall the sockets.
  out.monitor->set(zmq::sockopt::rcvhwm, 0);
  out.monitor->connect(monitor_endpoint);
  if (server) {
    // A send to a vanished peer fails (EHOSTUNREACH), one to a full queue would block (EAGAIN).
    s->set(zmq::sockopt::router_mandatory, true);
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
  return out;
}

}  // namespace troupe::transport
