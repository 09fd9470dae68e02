#pragma once
// When each peer was last heard from, stamped by the thread that reads the
// socket as each frame arrives — not when an actor gets round to the frame.
// A head whose actors fall behind (a burst of work, a long message) must not
// take its own delay for a node's silence: the gateway reads these stamps
// when it checks liveness. Thread-safe (a mutex; one stamp per frame).
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "transport/liveness.hpp"

namespace troupe::transport {

class ArrivalClock {
 public:
  void stamp(const std::string& peer, Clock::time_point when) {
    std::lock_guard<std::mutex> lock(mutex_);
    last_[peer] = when;
  }
  // The peers heard from since the last take(), with when they were last heard.
  std::vector<std::pair<std::string, Clock::time_point>> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::string, Clock::time_point>> out(last_.begin(), last_.end());
    last_.clear();
    return out;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, Clock::time_point> last_;
};

}  // namespace troupe::transport
