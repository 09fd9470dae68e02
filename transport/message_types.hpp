#pragma once
// The "t" of each message type, in the order of the Message variant (internal
// to transport/: type_name() and decode() share this one list).
#include <array>
#include <variant>

#include "transport/protocol.hpp"

namespace troupe::transport {

inline constexpr std::array<const char*, 18> kMessageTypes = {
    "submit", "accepted",     "rejected", "tokens",     "finished", "cancel",
    "status", "status_reply", "register", "registered", "refused",  "plan",
    "result", "heartbeat",    "drain",    "shutdown",   "error",    "reset"};
static_assert(kMessageTypes.size() == std::variant_size_v<Message>, "one name per message type");

}  // namespace troupe::transport
