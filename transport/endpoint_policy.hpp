#pragma once
// Which endpoints a server may bind without CurveZMQ: only those that other
// hosts cannot reach. `troupe serve` / `worker` check their --listen and
// --worker-listen with this, and SocketLoop::start checks every server socket
// again.
#include <string_view>

namespace troupe::transport {

// True for tcp:// on a loopback address (127.0.0.0/8, ::1, localhost, the
// interface `lo`), ipc:// and inproc://. False for anything else, including
// wildcards (tcp://*:5555, 0.0.0.0, ::) and other transports.
bool is_local_endpoint(std::string_view endpoint);

// Throws std::invalid_argument, saying which flags to add, when a server
// would bind a non-local endpoint with no CurveZMQ keys and without
// `insecure` (the --insecure flag).
void check_bind_security(std::string_view endpoint, bool has_curve_keys, bool insecure);

}  // namespace troupe::transport
