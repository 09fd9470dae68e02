#pragma once
// Termination signals as events: while a SignalWaiter lives, SIGINT and
// SIGTERM only set a flag (an async-signal-safe handler, whichever thread
// takes them), and the main thread polls wait() to act on them.
#include <chrono>
#include <optional>

namespace troupe::cluster {

class SignalWaiter {
 public:
  SignalWaiter();   // installs the handler for SIGINT and SIGTERM
  ~SignalWaiter();  // restores the previous handlers
  SignalWaiter(const SignalWaiter&) = delete;
  SignalWaiter& operator=(const SignalWaiter&) = delete;

  // The signal that arrived within `timeout`, if any.
  std::optional<int> wait(std::chrono::milliseconds timeout);
};

}  // namespace troupe::cluster
