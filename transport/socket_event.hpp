#pragma once
// What a SocketLoop tells its program about a socket's connections: libzmq's
// socket-monitor events (zmq_socket_monitor), in plain words. What libzmq
// 4.3.4 reports, client and server in separate contexts as in separate
// processes (found by experiment, 40 tries each; tests/transport/curve_test.cpp):
//
//   case                       client socket                    server socket
//   plain -> plain server      connected, handshake succeeded   (only failures are watched)
//   no keys -> CurveZMQ        connected, then either           failed: protocol (mechanism
//   server, or keys ->           failed: protocol (mechanism      mismatch) or no detail (EPIPE)
//   plain server                 mismatch), not retried, or
//                                failed: no detail (EPIPE),
//                                retried
//   key not allowed            connected, failed: auth (ZAP     failed: auth (ZAP 400)
//                                400), not retried
//   wrong server key           connected, failed: no detail     failed: protocol (cryptographic)
//                                (EPIPE), retried with backoff
//
// A mismatch is a race: the side that reads the other's greeting first
// reports it and hangs up, the other sees a broken pipe (in one ZeroMQ
// context, with one I/O thread, both sides always report the mismatch).
// A server's events name the endpoint it listens on, never the client's
// address (libzmq 4.3's monitor does not know it); a client's name the
// server's endpoint.
#include <cstdint>
#include <optional>
#include <string>

namespace troupe::transport {

struct SocketEvent {
  enum Kind {
    kConnected,           // client: TCP connected, handshake next
    kDisconnected,        // client: the connection closed (ZeroMQ reconnects by itself)
    kConnectRetried,      // client: a reconnect is scheduled
    kHandshakeSucceeded,  // client: frames can flow
    kHandshakeFailed,     // either side: this connection will carry no frame
  } kind = kConnected;
  std::string address;  // see above
  std::string reason;   // kHandshakeFailed: why, in plain words; else empty
  // kHandshakeFailed: the cause will not pass by itself (refused by ZAP, a
  // mechanism mismatch, a cryptographic error). False for a broken pipe
  // during the handshake, which a flaky link or a peer restarting also makes.
  bool certain = false;
};

// Whether a client should give up on its server's handshake: at once after
// a certain failure, or after `max_uncertain` failures in a row with no
// handshake succeeding between them (a keyless client of a CurveZMQ server
// sees broken pipes as often as mismatches; a flaky link sees one, then a
// success). Feed it every event of the socket.
class HandshakeVerdict {
 public:
  explicit HandshakeVerdict(int max_uncertain = 3) : max_uncertain_(max_uncertain) {}
  bool give_up(const SocketEvent& e) {
    if (e.kind == SocketEvent::kHandshakeSucceeded) uncertain_ = 0;
    if (e.kind != SocketEvent::kHandshakeFailed) return false;
    return e.certain || ++uncertain_ >= max_uncertain_;
  }

 private:
  int max_uncertain_;
  int uncertain_ = 0;
};

const char* to_string(SocketEvent::Kind kind);  // "connected", "handshake failed", ...

// The ZMQ_EVENT_* bits a SocketLoop watches on a socket of that side:
// handshake failures on both, the connection's life on a client.
int watched_events(bool server);

// A monitor event (ZMQ_EVENT_*, its value: an errno, a ZMQ_PROTOCOL_ERROR_*
// or a ZAP status code) as a SocketEvent; nullopt for one not watched.
// `curve`: whether this socket has CurveZMQ keys (the reason differs).
std::optional<SocketEvent> socket_event(uint16_t event, uint32_t value, std::string address, bool server,
                                        bool curve);

}  // namespace troupe::transport
