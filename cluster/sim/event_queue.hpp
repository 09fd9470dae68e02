#pragma once
// The simulator's clock: one queue of events in virtual time (integer
// nanoseconds). Ties are broken explicitly, so a run is a pure function of
// its inputs: events at the same time pop by kind in the order below
// (work finishing on workers first, then messages reaching workers, then
// results reaching the head, then faults, then timers, then new arrivals,
// then measurement), and events of one kind at one time in the order they were
// pushed.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace troupe::cluster::sim {

enum class EventKind : uint8_t {
  kStepDone = 0,      // a worker finished computing a step
  kPlanArrive = 1,    // a step plan reached its worker
  kResultArrive = 2,  // a step result reached the head
  kFault = 3,         // a scripted fault (SimOptions::faults) strikes a worker
  kWatchdog = 4,      // the head's step-deadline check (while a hung worker is not yet found out)
  kDeadline = 5,      // the batcher's timer for requests waiting for a worker
  kArrival = 6,       // a client sends a request
  kSample = 7,        // record the time series (sees everything else at that time)
  kAdmit = 8,         // a parallel run's: a request placed at an arrival joins its worker (in its lane)
};

struct Event {
  int64_t time = 0;
  EventKind kind = EventKind::kSample;
  uint64_t order = 0;   // push order: the last tie-break
  uint64_t target = 0;  // worker index or request index
};

class EventQueue {
 public:
  // Arrivals known in advance (a workload's), in time order: event i is
  // (times[i], kArrival, target i), as if pushed before anything else. They
  // wait in this list, not in the heap, so that a workload of a million
  // requests does not make every push and pop walk a million-entry heap;
  // pop() merges them in. Call once, before any push. Throws
  // std::invalid_argument when the times are not in order.
  void set_arrivals(std::vector<int64_t> times);
  // A binary heap (std::push_heap's layout, whose pop_heap pop() uses)
  // sifted up by hand: the new event stays in registers until its place is
  // found, where push_heap would write it and read it straight back, wider
  // than it was written (a store-forwarding stall at every push).
  void push(int64_t time, EventKind kind, uint64_t target) {
    const Event e{time, kind, pushed_++, target};
    size_t i = heap_.size();
    heap_.emplace_back();
    while (i > 0) {
      const size_t parent = (i - 1) / 2;
      if (!Later{}(heap_[parent], e)) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }
  Event pop() {
    if (arrival_next()) {
      const uint64_t i = next_arrival_++;
      return {arrivals_[i], EventKind::kArrival, i, i};
    }
    std::pop_heap(heap_.begin(), heap_.end(), Later{});
    const Event e = heap_.back();
    heap_.pop_back();
    return e;
  }
  // The event pop() would return next; null when there is none.
  const Event* peek() {
    if (arrival_next()) {
      peeked_ = {arrivals_[next_arrival_], EventKind::kArrival, next_arrival_, next_arrival_};
      return &peeked_;
    }
    return heap_.empty() ? nullptr : &heap_.front();
  }
  // Listed arrivals not popped yet.
  size_t arrivals_left() const { return arrivals_.size() - next_arrival_; }
  bool empty() const { return heap_.empty() && next_arrival_ == arrivals_.size(); }
  size_t size() const { return heap_.size() + (arrivals_.size() - next_arrival_); }
  uint64_t pushed() const { return pushed_; }

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      if (a.time != b.time) return a.time > b.time;
      if (a.kind != b.kind) return a.kind > b.kind;
      return a.order > b.order;
    }
  };
  bool arrival_next() const {
    if (next_arrival_ == arrivals_.size()) return false;
    if (heap_.empty()) return true;
    const Event a{arrivals_[next_arrival_], EventKind::kArrival, next_arrival_, 0};
    return Later{}(heap_.front(), a);
  }
  std::vector<Event> heap_;  // a heap under Later: the earliest event in front
  std::vector<int64_t> arrivals_;
  uint64_t next_arrival_ = 0;
  uint64_t pushed_ = 0;
  Event peeked_;  // peek()'s arrival
};

inline void EventQueue::set_arrivals(std::vector<int64_t> times) {
  if (pushed_ != 0 || !arrivals_.empty())
    throw std::invalid_argument("EventQueue::set_arrivals: call it once, before any push");
  if (!std::is_sorted(times.begin(), times.end()))
    throw std::invalid_argument("EventQueue::set_arrivals: the arrivals must be in time order");
  arrivals_ = std::move(times);
  pushed_ = arrivals_.size();
}

}  // namespace troupe::cluster::sim
