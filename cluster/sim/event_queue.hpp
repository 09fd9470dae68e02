#pragma once
// The simulator's clock: one queue of events in virtual time (integer
// nanoseconds). Ties are broken explicitly, so a run is a pure function of
// its inputs: events at the same time pop by kind in the order below
// (work finishing on workers first, then messages reaching workers, then
// results reaching the head, then timers, then new arrivals, then
// measurement), and events of one kind at one time in the order they were
// pushed.
#include <cstdint>
#include <queue>
#include <vector>

namespace troupe::cluster::sim {

enum class EventKind : uint8_t {
  kStepDone = 0,      // a worker finished computing a step
  kPlanArrive = 1,    // a step plan reached its worker
  kResultArrive = 2,  // a step result reached the head
  kDeadline = 3,      // the batcher's timer for requests waiting for a worker
  kArrival = 4,       // a client sends a request
  kSample = 5,        // record the time series (sees everything else at that time)
};

struct Event {
  int64_t time = 0;
  EventKind kind = EventKind::kSample;
  uint64_t order = 0;   // push order: the last tie-break
  uint64_t target = 0;  // worker index or request index
};

class EventQueue {
 public:
  void push(int64_t time, EventKind kind, uint64_t target) { heap_.push({time, kind, pushed_++, target}); }
  Event pop() {
    Event e = heap_.top();
    heap_.pop();
    return e;
  }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  uint64_t pushed() const { return pushed_; }

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      if (a.time != b.time) return a.time > b.time;
      if (a.kind != b.kind) return a.kind > b.kind;
      return a.order > b.order;
    }
  };
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  uint64_t pushed_ = 0;
};

}  // namespace troupe::cluster::sim
