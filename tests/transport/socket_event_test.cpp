// libzmq monitor events as SocketEvents: which are reported, and the words.
#include <gtest/gtest.h>
#include <zmq.h>

#include <cerrno>
#include <string>
#include <vector>

#include "transport/socket_event.hpp"

namespace troupe::transport {
namespace {

constexpr bool kServer = true, kClient = false, kCurve = true, kPlain = false;

std::string reason(uint16_t event, uint32_t value, bool server, bool curve) {
  auto e = socket_event(event, value, "tcp://127.0.0.1:1", server, curve);
  return e && e->kind == SocketEvent::kHandshakeFailed ? e->reason : "(no failure)";
}

TEST(SocketEvent, AServerReportsFailuresOnlyAClientItsConnectionToo) {
  for (uint16_t ev : {ZMQ_EVENT_CONNECTED, ZMQ_EVENT_DISCONNECTED, ZMQ_EVENT_CONNECT_RETRIED,
                      ZMQ_EVENT_HANDSHAKE_SUCCEEDED}) {
    EXPECT_FALSE(socket_event(ev, 0, "x", kServer, kCurve)) << ev;
    EXPECT_TRUE(socket_event(ev, 0, "x", kClient, kCurve)) << ev;
  }
  EXPECT_FALSE(socket_event(ZMQ_EVENT_ACCEPTED, 7, "x", kServer, kCurve));
  EXPECT_FALSE(socket_event(ZMQ_EVENT_CONNECT_DELAYED, 0, "x", kClient, kCurve));
  auto e = socket_event(ZMQ_EVENT_CONNECT_RETRIED, 100, "tcp://h:1", kClient, kPlain);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, SocketEvent::kConnectRetried);
  EXPECT_EQ(e->address, "tcp://h:1");
  EXPECT_EQ(e->reason, "");
  EXPECT_STREQ(to_string(SocketEvent::kHandshakeFailed), "handshake failed");
}

// Either side may see the mismatch or only the hang-up after it (socket_event.hpp).
TEST(SocketEvent, MismatchReadsTheSameFromEitherReport) {
  struct Case {
    bool server, curve;
    std::string mismatch, likely_cause_of_hang_up;
  };
  const std::string curve_client_cause = "the server key is wrong, or the server does not use CurveZMQ";
  const std::vector<Case> cases = {
      {kServer, kCurve, "the client sent no CurveZMQ key / uses another mechanism", ""},
      {kServer, kPlain, "the client uses CurveZMQ (or another mechanism) but this socket has no keys", ""},
      {kClient, kPlain, "the server wants CurveZMQ keys this client does not have", ""},
      {kClient, kCurve, "the server does not use CurveZMQ but this client has keys", curve_client_cause},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(reason(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
                     c.server, c.curve),
              c.mismatch);
    const std::string cause = c.likely_cause_of_hang_up.empty() ? c.mismatch : c.likely_cause_of_hang_up;
    EXPECT_EQ(reason(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE, c.server, c.curve),
              std::string(c.server ? "the client" : "the server") +
                  " hung up during the handshake (Broken pipe); likely cause: " + cause);
  }
}

TEST(SocketEvent, AuthenticationAndOtherProtocolErrors) {
  const uint16_t auth = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, protocol = ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;
  EXPECT_EQ(reason(auth, 400, kServer, kCurve), "its key is not allowed on this socket (ZAP 400)");
  EXPECT_EQ(reason(auth, 400, kClient, kCurve),
            "authentication failed: the server does not allow this client's key (ZAP 400)");
  EXPECT_EQ(reason(auth, 500, kClient, kCurve), "authentication failed (ZAP 500)");
  EXPECT_EQ(reason(protocol, ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC, kServer, kCurve),
            "the client's CurveZMQ hello does not open with this server's key: it trusts another server key");
  EXPECT_EQ(reason(protocol, ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_HELLO, kServer, kCurve),
            "protocol error: malformed HELLO (0x10000013)");
  EXPECT_EQ(reason(protocol, 0x1234, kServer, kCurve), "protocol error 0x00001234");
}

}  // namespace
}  // namespace troupe::transport

namespace troupe::transport {
namespace {

// A client gives up at once on a failure that will not pass, after three
// broken pipes in a row otherwise; a handshake that succeeds between them
// starts the count over (a flaky link, a server restarting).
TEST(HandshakeVerdict, CertainAtOnceUncertainThreeInARow) {
  SocketEvent pipe{SocketEvent::kHandshakeFailed, "tcp://h:1", "broken pipe", false};
  SocketEvent refused{SocketEvent::kHandshakeFailed, "tcp://h:1", "key not allowed", true};
  SocketEvent ok{SocketEvent::kHandshakeSucceeded, "tcp://h:1", "", false};
  SocketEvent retried{SocketEvent::kConnectRetried, "tcp://h:1", "", false};
  HandshakeVerdict v;
  EXPECT_TRUE(v.give_up(refused));
  HandshakeVerdict flaky;
  EXPECT_FALSE(flaky.give_up(pipe));
  EXPECT_FALSE(flaky.give_up(retried));
  EXPECT_FALSE(flaky.give_up(pipe));
  EXPECT_FALSE(flaky.give_up(ok));
  EXPECT_FALSE(flaky.give_up(pipe));
  EXPECT_FALSE(flaky.give_up(pipe));
  EXPECT_TRUE(flaky.give_up(pipe)) << "three in a row";
  // What libzmq reports, as certain or not.
  EXPECT_FALSE(socket_event(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE, "a", false, true)->certain);
  EXPECT_TRUE(socket_event(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 400, "a", false, true)->certain);
  EXPECT_TRUE(socket_event(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
                           "a", false, false)
                  ->certain);
}

}  // namespace
}  // namespace troupe::transport
