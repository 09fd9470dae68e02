#include "transport/liveness.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe::transport {

Liveness::Liveness(const LivenessOptions& options, Clock::time_point now)
    : options_(options), last_seen_(now), next_heartbeat_(now + options.heartbeat_interval) {
  if (options.heartbeat_interval.count() <= 0)
    throw std::invalid_argument("liveness: heartbeat interval must be > 0 ms, got " +
                                std::to_string(options.heartbeat_interval.count()));
  if (options.liveness < 3 || options.liveness > 5)
    throw std::invalid_argument("liveness: a peer is lost after 3 to 5 silent intervals, got " +
                                std::to_string(options.liveness));
}

void Liveness::on_message(Clock::time_point now) { last_seen_ = std::max(last_seen_, now); }

void Liveness::on_sent(Clock::time_point now) {
  next_heartbeat_ = std::max(next_heartbeat_, now + options_.heartbeat_interval);
}

int Liveness::missed(Clock::time_point now) const {
  if (now <= last_seen_) return 0;
  return static_cast<int>((now - last_seen_) / options_.heartbeat_interval);
}

Backoff::Backoff(const BackoffOptions& options) : options_(options), current_(options.initial) {
  if (options.initial.count() <= 0 || options.max < options.initial)
    throw std::invalid_argument("backoff: need 0 < initial <= max, got initial " +
                                std::to_string(options.initial.count()) + " ms, max " +
                                std::to_string(options.max.count()) + " ms");
}

std::chrono::milliseconds Backoff::next() {
  const auto delay = current_;
  current_ = std::min(options_.max, current_ * 2);
  ++attempts_;
  return delay;
}

void Backoff::reset() {
  current_ = options_.initial;
  attempts_ = 0;
}

}  // namespace troupe::transport
