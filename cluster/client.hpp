#pragma once
// A client of a head's front socket for code without actors (`troupe submit`,
// `troupe status`, `troupe bench --to`, tests): messages out with send(),
// messages in, in order, with next() (or, with ClientOptions::on_message, to
// a function on the socket thread). One SocketLoop thread underneath; any
// number of jobs may be in flight (tell them apart by tag). An error without
// a tag is about the connection, so about every job: the head cut this
// client off (`too_slow`), or the CurveZMQ handshake failed (then it comes
// within moments of connecting).
#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "transport/inbox.hpp"
#include "transport/socket_loop.hpp"

namespace troupe::cluster {

struct ClientOptions {
  std::string endpoint;                             // the head's client endpoint, tcp://HOST:5555
  std::optional<transport::CurveClientKeys> curve;  // nullopt = plaintext
  size_t max_frame_bytes = transport::kDefaultMaxFrameBytes;
  bool quiet = true;  // no log lines from the socket loop
  // When set, each message from the head goes to this function, called on
  // the client's socket thread as it arrives, instead of waiting for next()
  // (which then has nothing to give, and status() nothing to find): a
  // caller with many jobs in flight is not woken once per message.
  std::function<void(transport::Message&&)> on_message;
};

class Client {
 public:
  explicit Client(const ClientOptions& options);  // connects (asynchronously)
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool send(const transport::Message& message);
  // Before the client goes: the frames sent so far may still leave for up to
  // `timeout` (the socket lingers that long when it closes; without this,
  // frames still queued then are dropped). False if they were not handed
  // to the socket in time.
  bool flush(std::chrono::milliseconds timeout) { return loop_.flush(timeout); }
  // Any bytes as one frame (tests of what a server does with garbage).
  bool send_raw(std::string body);
  // The next message from the head, or nullopt after `timeout` of silence.
  std::optional<transport::Message> next(std::chrono::milliseconds timeout);

  // A status request and its reply (nullopt when none came in time, or an
  // error about the connection came: failure() says which).
  std::optional<transport::StatusReply> status(std::chrono::milliseconds timeout);
  // The last error about the connection itself that status() met ("" = none).
  const std::string& failure() const { return failure_; }

 private:
  transport::SocketLoop loop_;
  transport::SocketId socket_ = 0;
  transport::Inbox<transport::Message> inbox_;
  std::function<void(transport::Message&&)> deliver_;  // to inbox_, or ClientOptions::on_message
  std::string failure_;
};

}  // namespace troupe::cluster
