#pragma once
// A worker's step stream between the head and a node, made whole again after
// frames are lost. ZeroMQ keeps frames in order on one connection, but a
// connection that drops (a reset, a link down past TCP's patience) loses
// whatever its queues held, and a DEALER reconnects under the same identity
// as if nothing happened. Plans and results are numbered by their step id
// (1, 2, 3, ... per worker), so each side knows what it has:
//
//   head                                   node
//   Unacked plans ──plan k──────────────▶  InOrder<StepPlan>: runs k once, in order
//   InOrder<StepResult> ◀──────result k──  Unacked results (until the head acks k)
//         └─ heartbeat {acks: results_received} ─▶  forget acked; resend the rest
//         ◀─ heartbeat {progress: plans_received} ─┘  resend plans the node lacks
//
// A frame that is missing after `grace` (longer than a frame takes to
// arrive) is sent again; duplicates and frames that arrive early are sorted
// out by the receiver: nothing is applied twice, nothing is skipped. Plain
// classes, no sockets or clocks of their own; one per worker, one thread.
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "transport/liveness.hpp"

namespace troupe::transport {

// Receives numbered items and hands them on in order, each once.
template <class T>
class InOrder {
 public:
  // `first`: the number of the first item; `max_early`: items past a gap kept
  // at most (more are dropped: the sender sends them again).
  explicit InOrder(uint64_t first = 1, size_t max_early = 64) : next_(first), max_early_(max_early) {}

  // Item `seq` arrived. Returns what can be handed on now, in order: this one
  // and any kept ones that follow it; nothing for a duplicate (seq already
  // handed on or kept) or one past a gap (kept for later).
  std::vector<T> arrive(uint64_t seq, T item) {
    std::vector<T> out;
    if (seq < next_ || early_.count(seq)) return out;
    if (seq > next_) {
      if (early_.size() < max_early_) early_.emplace(seq, std::move(item));
      return out;
    }
    out.push_back(std::move(item));
    ++next_;
    for (auto it = early_.find(next_); it != early_.end(); it = early_.find(next_)) {
      out.push_back(std::move(it->second));
      early_.erase(it);
      ++next_;
    }
    return out;
  }
  // Every item up to this number has been handed on (first - 1 before any).
  uint64_t delivered() const { return next_ - 1; }
  size_t early() const { return early_.size(); }

 private:
  uint64_t next_;
  size_t max_early_;
  std::map<uint64_t, T> early_;
};

// Frames sent and kept until the peer says it has them.
class Unacked {
 public:
  // Frame `seq` (numbers increase by one) left now.
  void sent(uint64_t seq, std::string body, Clock::time_point now);
  // The peer has every frame up to `seq`: they are forgotten.
  void acked(uint64_t seq);
  // The peer has every frame up to `have` (and so those are forgotten);
  // returns the bodies of the later ones that left at least `grace` ago and
  // were not sent again within `grace`, oldest first (and stamps them sent now).
  std::vector<std::string> resend(uint64_t have, Clock::time_point now, Clock::duration grace);
  uint64_t last_sent() const { return last_sent_; }
  size_t size() const { return frames_.size(); }

 private:
  struct Frame {
    uint64_t seq;
    std::string body;
    Clock::time_point sent;
  };
  std::deque<Frame> frames_;  // by seq, oldest first
  uint64_t last_sent_ = 0;
};

}  // namespace troupe::transport
