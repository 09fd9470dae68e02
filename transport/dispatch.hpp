#pragma once
// From frames to messages: the FrameHandler most users of SocketLoop want.
//
//   loop.on_frame(decode_frames(loop, [&](SocketId s, const std::string& peer, Message&& m) {
//     caf::anon_send(router, ...);  // on the loop thread: hand over, never block
//   }));
//
// A frame that does not decode is answered with an `error` frame to its
// sender (code, message naming the field, the job's tag when readable), a
// log line (throttled), and goes no further: nothing else changes. An
// unreadable frame that called itself an `error` gets no answer, so two
// peers can never trade errors forever.
#include <functional>
#include <string>

#include "transport/protocol.hpp"
#include "transport/socket_loop.hpp"

namespace troupe::transport {

using MessageHandler = std::function<void(SocketId socket, const std::string& peer, Message&& message)>;

// `loop` must outlive the handler (it answers through it). `limits` bound a
// submit's fields as it is read (a client socket's frames).
SocketLoop::FrameHandler decode_frames(SocketLoop& loop, MessageHandler on_message,
                                       const SubmitLimits& limits = {});

}  // namespace troupe::transport
