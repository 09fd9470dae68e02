#pragma once
// Peer liveness and reconnect pacing, after the ZeroMQ guide's Paranoid
// Pirate pattern (chapter 4, "Reliable Request-Reply"): heartbeats flow both
// ways on the same socket as the data, any message counts as a beat, and a
// peer silent for `liveness` intervals (3-5) is dead. Whoever lost its peer
// reconnects after a delay that doubles up to a maximum.
//
// Plain classes: no threads, no clocks, no sockets. The caller passes `now`
// (the membership code from its tick, tests with made-up times).
#include <chrono>

namespace troupe::transport {

using Clock = std::chrono::steady_clock;

struct LivenessOptions {
  std::chrono::milliseconds heartbeat_interval{1000};  // > 0: send a beat after this long without sending
  int liveness = 3;  // 3..5: intervals of silence after which the peer is lost
};

// One peer as seen from this side.
class Liveness {
 public:
  // Throws std::invalid_argument unless heartbeat_interval > 0 and liveness is in [3, 5].
  Liveness(const LivenessOptions& options, Clock::time_point now);

  // Anything arrived from the peer (data or heartbeat).
  void on_message(Clock::time_point now);
  // Anything was sent to the peer: no heartbeat is due for an interval.
  void on_sent(Clock::time_point now);

  // Nothing was sent for a whole interval: send a heartbeat (then on_sent).
  bool due_heartbeat(Clock::time_point now) const { return now >= next_heartbeat_; }
  // Silent for `liveness` intervals.
  bool lost(Clock::time_point now) const { return now >= deadline(); }
  // Whole intervals since the peer was last heard from (beats missed).
  int missed(Clock::time_point now) const;

  Clock::time_point last_seen() const { return last_seen_; }
  Clock::time_point deadline() const { return last_seen_ + options_.liveness * options_.heartbeat_interval; }
  Clock::time_point next_heartbeat() const { return next_heartbeat_; }
  const LivenessOptions& options() const { return options_; }

 private:
  LivenessOptions options_;
  Clock::time_point last_seen_;
  Clock::time_point next_heartbeat_;
};

struct BackoffOptions {
  std::chrono::milliseconds initial{1000};  // > 0: the first delay
  std::chrono::milliseconds max{32000};     // >= initial: delays double up to this
};

// Delays between reconnect attempts: initial, 2x, 4x, ... capped at max;
// reset() after a success starts over.
class Backoff {
 public:
  // Throws std::invalid_argument unless 0 < initial <= max.
  explicit Backoff(const BackoffOptions& options);

  // The delay before the next attempt; each call counts one attempt.
  std::chrono::milliseconds next();
  void reset();
  int attempts() const { return attempts_; }

 private:
  BackoffOptions options_;
  std::chrono::milliseconds current_;
  int attempts_ = 0;
};

}  // namespace troupe::transport
