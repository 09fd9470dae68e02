#include "transport/dispatch.hpp"

#include <memory>

#include "transport/log_throttle.hpp"

namespace troupe::transport {

SocketLoop::FrameHandler decode_frames(SocketLoop& loop, MessageHandler on_message,
                                       const SubmitLimits& limits) {
  auto throttle = std::make_shared<LogThrottle>();
  return [&loop, on_message = std::move(on_message), throttle, limits](Frame&& frame) {
    Decoded d = decode(frame.body, loop.max_frame_bytes(), limits);
    if (d.ok()) {
      on_message(frame.socket, frame.peer, std::move(*d.message));
      return;
    }
    uint64_t count = 0;
    if (throttle->allow(&count))
      loop.log(loop.name(frame.socket) + ": unreadable frame of " + std::to_string(frame.body.size()) +
               " bytes: " + to_string(d.error.code) + ": " + d.error.message + " (" + std::to_string(count) +
               " so far)");
    if (d.error.type != "error") loop.send_message(frame.socket, frame.peer, error_reply(d.error));
  };
}

}  // namespace troupe::transport
