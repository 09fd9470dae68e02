#pragma once
// Keeps a hostile peer from flooding the log: the first `burst` events of a
// kind are logged, then one in `every`, each saying how many were counted.
// Thread-safe (one atomic counter).
#include <atomic>
#include <cstdint>

namespace troupe::transport {

class LogThrottle {
 public:
  explicit LogThrottle(uint64_t burst = 20, uint64_t every = 1000) : burst_(burst), every_(every) {}

  // Counts one event; true when this one should be logged. `count` gets the
  // events counted so far, this one included.
  bool allow(uint64_t* count = nullptr) {
    const uint64_t n = ++count_;
    if (count) *count = n;
    return n <= burst_ || n % every_ == 0;
  }

 private:
  uint64_t burst_, every_;
  std::atomic<uint64_t> count_{0};
};

}  // namespace troupe::transport
