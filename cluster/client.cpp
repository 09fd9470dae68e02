#include "cluster/client.hpp"

#include "cluster/control_plane.hpp"
#include "transport/dispatch.hpp"

namespace troupe::cluster {

Client::Client(const ClientOptions& o) : loop_(loop_options(o.max_frame_bytes, o.quiet)) {
  socket_ = loop_.add_socket(client_socket(o.endpoint, "head", o.curve));
  if (o.on_message)
    deliver_ = o.on_message;
  else
    deliver_ = [this](transport::Message&& m) { inbox_.push(std::move(m)); };
  loop_.on_frame(transport::decode_frames(loop_, [this](transport::SocketId, const std::string&,
                                                        transport::Message&& m) { deliver_(std::move(m)); }));
  // A handshake that fails (keys the head does not take, a server key that is
  // not the head's, keys on one side only) comes to the caller as an untagged
  // error at once, instead of a silence that lasts until its timeout.
  const std::string endpoint = o.endpoint;
  loop_.on_socket_event([this, endpoint, verdict = transport::HandshakeVerdict()](
                            transport::SocketId, const transport::SocketEvent& e) mutable {
    if (!verdict.give_up(e)) return;
    deliver_(transport::Error{transport::ErrorCode::kUnexpected,
                              "the CurveZMQ handshake with the head at " + endpoint + " failed: " + e.reason,
                              std::nullopt});
  });
  loop_.start();
}

Client::~Client() { loop_.stop(); }

bool Client::send(const transport::Message& message) { return loop_.send_message(socket_, {}, message); }

bool Client::send_raw(std::string body) { return loop_.send(socket_, {}, std::move(body)); }

std::optional<transport::Message> Client::next(std::chrono::milliseconds timeout) {
  return inbox_.pop(timeout);
}

std::optional<transport::StatusReply> Client::status(std::chrono::milliseconds timeout) {
  if (!send(transport::Status{})) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    auto m = next(left);
    if (!m) return std::nullopt;
    if (auto* s = std::get_if<transport::StatusReply>(&*m)) return *s;
    if (auto* e = std::get_if<transport::Error>(&*m); e && !e->tag) {
      failure_ = e->message;
      return std::nullopt;
    }
  }
}

}  // namespace troupe::cluster
