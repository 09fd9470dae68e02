#include "transport/socket_event.hpp"

#include <cstdio>
#include <cstring>
#include <utility>

#include <zmq.h>

namespace troupe::transport {
namespace {

std::string protocol_error(uint32_t code) {
  struct Name {
    uint32_t code;
    const char* text;
  };
  static const Name names[] = {
      {ZMQ_PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND, "unexpected ZMTP command"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_INVALID_SEQUENCE, "invalid ZMTP sequence"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE, "key exchange failed"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_UNSPECIFIED, "malformed ZMTP command"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_MESSAGE, "malformed MESSAGE"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_HELLO, "malformed HELLO"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_INITIATE, "malformed INITIATE"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_ERROR, "malformed ERROR"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_READY, "malformed READY"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_WELCOME, "malformed WELCOME"},
      {ZMQ_PROTOCOL_ERROR_ZMTP_INVALID_METADATA, "invalid metadata"},
      {ZMQ_PROTOCOL_ERROR_ZAP_MALFORMED_REPLY, "malformed ZAP reply"},
      {ZMQ_PROTOCOL_ERROR_ZAP_BAD_REQUEST_ID, "ZAP reply to another request"},
      {ZMQ_PROTOCOL_ERROR_ZAP_BAD_VERSION, "ZAP version"},
      {ZMQ_PROTOCOL_ERROR_ZAP_INVALID_STATUS_CODE, "ZAP status code"},
      {ZMQ_PROTOCOL_ERROR_ZAP_INVALID_METADATA, "ZAP metadata"},
  };
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%08x", static_cast<unsigned>(code));
  for (const Name& n : names)
    if (n.code == code) return std::string("protocol error: ") + n.text + " (" + hex + ")";
  return std::string("protocol error ") + hex;
}

// What a mechanism mismatch means from this side.
const char* mismatch(bool server, bool curve) {
  if (server)
    return curve ? "the client sent no CurveZMQ key / uses another mechanism"
                 : "the client uses CurveZMQ (or another mechanism) but this socket has no keys";
  return curve ? "the server does not use CurveZMQ but this client has keys"
               : "the server wants CurveZMQ keys this client does not have";
}

std::string failure(uint16_t event, uint32_t value, bool server, bool curve) {
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
    const std::string status = "ZAP " + std::to_string(value);
    if (value == 400)
      return server ? "its key is not allowed on this socket (" + status + ")"
                    : "authentication failed: the server does not allow this client's key (" + status + ")";
    return "authentication failed (" + status + ")";
  }
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
    // The side that reads the other's greeting first reports a mismatch and
    // hangs up; this side only sees the broken pipe. A CurveZMQ server also
    // hangs up on a HELLO it cannot open (a wrong server key).
    const char* cause = !server && curve ? "the server key is wrong, or the server does not use CurveZMQ"
                                         : mismatch(server, curve);
    return std::string(server ? "the client" : "the server") + " hung up during the handshake (" +
           std::strerror(static_cast<int>(value)) + "); likely cause: " + cause;
  }
  if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) return mismatch(server, curve);
  if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
    return server ? "the client's CurveZMQ hello does not open with this server's key: it trusts another "
                    "server key"
                  : "the server's CurveZMQ reply does not open: it is not the server key this client trusts";
  return protocol_error(value);
}

}  // namespace

const char* to_string(SocketEvent::Kind kind) {
  static const char* const names[] = {"connected", "disconnected", "connect retried", "handshake succeeded",
                                      "handshake failed"};
  return names[kind];
}

int watched_events(bool server) {
  const int failures = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  if (server) return failures;
  return failures | ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED |
         ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
}

std::optional<SocketEvent> socket_event(uint16_t event, uint32_t value, std::string address, bool server,
                                        bool curve) {
  if (!(event & watched_events(server))) return std::nullopt;
  static const std::pair<uint16_t, SocketEvent::Kind> connection[] = {
      {ZMQ_EVENT_CONNECTED, SocketEvent::kConnected},
      {ZMQ_EVENT_DISCONNECTED, SocketEvent::kDisconnected},
      {ZMQ_EVENT_CONNECT_RETRIED, SocketEvent::kConnectRetried},
      {ZMQ_EVENT_HANDSHAKE_SUCCEEDED, SocketEvent::kHandshakeSucceeded},
  };
  SocketEvent e{SocketEvent::kHandshakeFailed, std::move(address), ""};
  for (const auto& [zmq_event, kind] : connection)
    if (zmq_event == event) e.kind = kind;
  if (e.kind == SocketEvent::kHandshakeFailed) {
    e.reason = failure(event, value, server, curve);
    e.certain = event != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
  }
  return e;
}

}  // namespace troupe::transport
