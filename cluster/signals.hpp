#pragma once
// Termination signals as events: construct first thing in main() (before any
// thread starts, so every thread inherits the mask), then poll wait() from
// the main thread. SIGINT and SIGTERM are blocked in every thread and taken
// here, synchronously (sigtimedwait), so no handler runs in an arbitrary
// thread mid-allocation.
#include <chrono>
#include <optional>

namespace troupe::cluster {

class SignalWaiter {
 public:
  SignalWaiter();   // blocks SIGINT and SIGTERM in this thread (and all it starts)
  ~SignalWaiter();  // restores the mask
  SignalWaiter(const SignalWaiter&) = delete;
  SignalWaiter& operator=(const SignalWaiter&) = delete;

  // The signal that arrived within `timeout`, if any.
  std::optional<int> wait(std::chrono::milliseconds timeout);
};

}  // namespace troupe::cluster
