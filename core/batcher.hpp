#pragma once
// Batcher: the pure core of the cluster's batcher. One Scheduler per worker;
// places each new request on a worker, drives each worker on its own (up to
// max_steps_in_flight steps, planned as soon as a result returns), moves
// requests off a worker that is lost or drained, and keeps requests that no
// worker can run yet until a deadline.
//
//   submit ──▶ place ──▶ worker w's Scheduler ──schedule()──▶ (w, StepPlan) ──▶ worker w
//                ▲                    ▲                                          │
//     lost/drain │  (recompute)       └──────────── on_result(w, StepResult) ◀───┘
//                └── extract_all(w)
//
// Placement (PlacementPolicy): round-robin, least-loaded (running + waiting
// sequences, then free KV blocks), or prefix affinity (the worker whose prefix
// cache holds the longest prefix of the prompt, ties to least-loaded).
//
// No threads, clocks or I/O: time comes in as `now` (nanoseconds, any
// epoch), so the batcher actor and the discrete-event simulator drive the
// same code. Not thread-safe, but for lanes (below): two threads may each
// run results and plans of their own workers at once.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/prefix_root_index.hpp"
#include "core/request.hpp"
#include "core/scheduler.hpp"
#include "core/step_cost.hpp"
#include "core/step_plan.hpp"

namespace troupe::core {

enum class PlacementPolicy { kRoundRobin, kLeastLoaded, kPrefixAffinity };
// "round-robin", "least-loaded", "prefix-affinity".
const char* to_string(PlacementPolicy policy);
// The inverse; std::invalid_argument on anything else.
PlacementPolicy parse_placement(const std::string& text);

struct BatcherOptions {
  PlacementPolicy placement = PlacementPolicy::kPrefixAffinity;
  int64_t unplaced_timeout_ns = 30'000'000'000;  // a request no worker can take fails after this; > 0
  int32_t max_unplaced = 4096;                   // requests waiting for any worker at most; >= 0
  // Step deadlines (take_hung): a step may run max(floor, margin x its
  // predicted cost); one its worker's cost model cannot predict yet (no
  // model, or too few steps to fit one) may run max(floor, cold). floor 0 =
  // no deadlines.
  int64_t step_timeout_floor_ns = 5'000'000'000;  // >= 0
  double step_timeout_margin = 8.0;               // >= 1
  int64_t step_timeout_cold_ns = 60'000'000'000;  // >= 0
};

// Why a worker left the batcher (BatcherCounters, logs).
enum class WorkerExit {
  kDrained,  // it drained and was let go
  kLost,     // its process or host is gone (missed heartbeats, exited)
  kHung,     // a step ran past its deadline: fenced, its late results are dropped
  kBroken,   // it sent a result that does not fit its plan
};
const char* to_string(WorkerExit why);  // "drained", "lost", "hung", "broken"

// What the batcher did about faults since it started.
struct BatcherCounters {
  int64_t workers_lost = 0, workers_hung = 0, workers_broken = 0;
  int64_t requests_moved = 0;     // unfinished requests taken off a worker that left, to run elsewhere
  int64_t tokens_recomputed = 0;  // their tokens (prompt + generated so far) whose KV is computed again
};

// A worker whose oldest step ran past its deadline (take_hung).
struct HungWorker {
  uint64_t worker = 0;
  uint64_t step_id = 0;     // the step it did not finish
  int64_t running_ns = 0;   // how long that step had been its oldest in flight
  int64_t deadline_ns = 0;  // what it was allowed
};

// A worker as the batcher sees it: its name and its scheduler's settings
// (pool size, budgets; max_model_len and vocab_size come from its model).
struct WorkerSpec {
  uint64_t id = 0;     // unique among live workers
  std::string node;    // process or host it lives on (status, logs)
  std::string device;  // "cpu", "cuda:0", "emulated"
  SchedulerOptions scheduler;
  std::shared_ptr<StepCostModel> cost =
      nullptr;  // its steps' predicted cost (deadlines); null = floor/cold only
};

enum class WorkerState { kActive, kDraining };

struct WorkerStats {
  uint64_t id = 0;
  std::string node, device;
  WorkerState state = WorkerState::kActive;
  SchedulerStats scheduler;
  int64_t tokens_generated = 0;  // over its life
  int64_t steps = 0;             // results received
  double busy_ms = 0;            // sum of the worker's step times (StepResult::forward_ms)
  double idle_ms = 0;            // sum of its waits for a plan (StepResult::idle_ms)
};

struct Dispatch {
  uint64_t worker = 0;
  StepPlan plan;
};

class Batcher {
 public:
  explicit Batcher(const BatcherOptions& options = {});
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Membership. add_worker refuses (with the reason) a duplicate id or a
  // worker whose model disagrees with the others (vocabulary, eos). Requests
  // waiting for any worker are placed at the next schedule().
  std::optional<std::string> add_worker(const WorkerSpec& spec);
  // The worker and its KV are gone: its steps in flight are dropped and every
  // unfinished request on it moves to the other workers (prompt + tokens so
  // far, recomputed), or waits for one. `why` is counted (counters()). False
  // for an unknown id.
  bool remove_worker(uint64_t id, int64_t now, WorkerExit why = WorkerExit::kLost);
  // No new requests go to the worker; those it has not started move elsewhere
  // now (or stay, when no other worker can take them); the running ones
  // finish there. `drained()` says when it is empty; at a drain deadline,
  // remove_worker() moves what is left.
  bool drain_worker(uint64_t id);
  bool drained(uint64_t id) const;
  bool has_worker(uint64_t id) const { return by_id_.count(id) != 0; }
  size_t num_workers() const { return workers_.size(); }

  // Queues a request on a worker (placement) or, with no worker able to take
  // it now, until one joins (up to unplaced_timeout_ns). Refuses (with the
  // reason, changing nothing) an id in use, too many unplaced requests, or a
  // request that no live worker could ever run.
  std::optional<std::string> submit(Request request, int64_t now);
  // Ends a request wherever it is (final event with `reason`); false when unknown.
  bool finish(uint64_t id, FinishReason reason, const std::string& error = {});
  bool cancel(uint64_t id) { return finish(id, FinishReason::kCancelled); }

  // The result of worker's oldest step in flight. A result that does not fit
  // the plan means a broken worker: it is removed (remove_worker) and the
  // reason returned.
  std::optional<std::string> on_result(uint64_t worker, const StepResult& result, int64_t now);
  // Step deadlines (the watchdog; call it every fraction of the floor): every
  // worker whose oldest step in flight has been its oldest for longer than
  // the step's deadline is hung. It is removed as a lost worker is (its
  // requests move, recomputed; a result it sends later is dropped as any
  // from an unknown id) and returned. A step becomes the oldest when it is
  // planned with none in flight, or when the result before it comes (the
  // worker had it queued). Nothing when deadlines are off.
  std::vector<HungWorker> take_hung(int64_t now);
  // Plans a step for every worker that can take one and has work; places
  // waiting requests first; fails unplaced requests past their deadline.
  std::vector<Dispatch> schedule(int64_t now);
  // schedule() for the workers whose state can have changed since their last
  // plan: `worker` (its result came, or a request was placed on it) and any
  // that takes a waiting request now. Plans exactly what schedule() would when
  // nothing else changed, in O(1) workers instead of all (the simulator calls
  // it after every event).
  std::vector<Dispatch> schedule(int64_t now, uint64_t worker);
  // The same into `out` (cleared first), whose buffer is kept for the next
  // call (the simulator's: no allocation per event).
  void schedule(int64_t now, uint64_t worker, std::vector<Dispatch>& out);
  // The earliest deadline of an unplaced request (for a timer), if any.
  std::optional<int64_t> next_deadline() const;

  std::vector<RequestEvent> take_events();
  // The same into `out` (cleared first), whose buffer is kept for the next
  // events (no allocation per step for a caller that keeps one vector).
  void take_events(std::vector<RequestEvent>& out);

  // Lanes: on_result, schedule and admit for one worker that leave the state
  // all workers share alone, so that threads can each drive their own
  // workers at once (the simulator's parallel run), one lane each. What the calls would
  // change of the shared state waits in the lane — the events they produce,
  // the requests that finished, the first blocks the worker cached or evicted
  // (the prefix-affinity index) — until merge(lane), which the caller makes
  // while no lane call runs; the events are the caller's to take
  // (Lane::events) meanwhile. Between merges nothing else may be called but
  // the lane calls, for distinct workers per lane, and the const queries;
  // the result is then the same as the plain calls' in any order of the
  // workers. Lane calls need no request waiting for a worker (they throw
  // std::logic_error otherwise), and a result that does not fit its plan is
  // returned as the error without removing the worker (the caller stops).
  class Lane {
   public:
    std::vector<RequestEvent> events;  // produced since the caller last took them, in order

   private:
    friend class Batcher;
    struct RootChange {
      uint64_t worker;
      bool cached;
      int32_t n;
      size_t offset;  // into root_tokens_
    };
    std::vector<RequestEvent> collected_;  // collect()'s buffer
    std::vector<uint64_t> finished_;       // requests to forget (where_)
    std::vector<RootChange> roots_;        // in order, per worker as they happened
    std::vector<int32_t> root_tokens_;
  };
  std::optional<std::string> on_result(uint64_t worker, const StepResult& result, int64_t now, Lane& lane);
  // submit() in two halves, so that a request's admission runs in its
  // worker's lane: choose() refuses what submit() refuses, picks the worker
  // and records the request's home (its id's worker, at once); admit(), in
  // that worker's lane, queues the request on its scheduler. A request that
  // no worker can take now (submit() would keep it waiting) is refused.
  std::optional<std::string> choose(const Request& request, uint64_t& worker);
  void admit(uint64_t worker, Request request, Lane& lane);
  void schedule(int64_t now, uint64_t worker, std::vector<Dispatch>& out, Lane& lane);
  // Applies what the lane's calls left waiting (its events stay in it).
  void merge(Lane& lane);

  bool has_unfinished() const { return !where_.empty(); }
  int32_t num_unfinished() const { return static_cast<int32_t>(where_.size()); }
  int32_t num_unplaced() const { return static_cast<int32_t>(unplaced_.size()); }
  // Requests queued, not yet running anywhere (unplaced + waiting in schedulers).
  int32_t num_waiting() const;
  int32_t num_running() const;
  std::vector<WorkerStats> worker_stats() const;
  const BatcherCounters& counters() const { return counters_; }
  // Which worker holds a request (0 = unplaced or unknown).
  uint64_t worker_of(uint64_t request_id) const;
  const Scheduler* scheduler(uint64_t worker) const;
  // Throws std::logic_error when placement's copy of a worker's load, free
  // blocks or state (the board) disagrees with the worker (tests).
  void check_invariants() const;

 private:
  struct Worker;
  // What placement reads of one worker, kept in one dense array (order_'s
  // order) so that a pick over many workers reads it in a few cache lines
  // instead of each worker's scheduler: refresh() copies it after every call
  // that can change the worker's scheduler.
  struct Candidate {
    uint64_t id = 0;        // the worker's
    int32_t load = 0;       // running + waiting sequences
    int32_t free = 0;       // free KV blocks
    int32_t fit_class = 0;  // index into fit_classes_
    bool active = true;     // WorkerState::kActive
  };
  void refresh(const Worker& w);
  // The worker with this id, or null: by_id_'s lookup (one or two cache
  // misses where the ordered map's walks its levels; every result asks).
  Worker* find(uint64_t id) const;
  void rebuild_order();
  struct Unplaced {
    Request request;
    int64_t deadline = 0;
  };
  Worker* pick(const Request& r);
  // The first reason a live worker gives for refusing r, when all refuse it.
  std::optional<std::string> refused_by_all(const Request& r) const;
  // The final event of a request that never reached a worker.
  void fail_unplaced(const Request& r, const std::string& error, FinishReason reason = FinishReason::kError);
  // Moves from r only when it returns true.
  bool place(Request& r, int64_t now);
  void move_all(Worker& w, int64_t now);
  // Places (or fails) the requests waiting for a worker; appends the workers
  // that took one to `placed`.
  void place_unplaced(int64_t now, std::vector<uint64_t>& placed);
  void plan(uint64_t id, Worker& w, int64_t now, std::vector<Dispatch>& out, Lane* lane = nullptr);
  // The deadline of `plan` on w (ns), from w's cost model and the options.
  int64_t step_deadline(Worker& w, const StepPlan& plan) const;
  // Takes the worker's events into events_ (or the lane's), forgetting
  // finished requests (or leaving that to merge()).
  void collect(Worker& w, Lane* lane = nullptr);
  // A result taken: the worker's counters and step deadlines.
  void took_result(Worker& w, const StepResult& result, int64_t now);
  // Worker w's root observer: to the index, or to the lane of the call that runs.
  void root_changed(Worker& w, const int32_t* tokens, bool cached);
  // A worker's first block cached or evicted, into the prefix-affinity index.
  void apply_root_change(uint64_t worker, const int32_t* tokens, int32_t n, bool cached);
  // The lane checks: no unplaced request, a known worker.
  Worker* lane_worker(uint64_t id, const char* what) const;
  class LaneCall;
  // What submit() and choose() refuse before placement: an id in use, a
  // request no live worker could ever run.
  std::optional<std::string> refusal(const Request& request) const;

  BatcherOptions options_;
  std::map<uint64_t, std::unique_ptr<Worker>> workers_;  // by id: deterministic iteration
  std::vector<Worker*> order_;                           // the same in a vector: placement's scan
  std::unordered_map<uint64_t, Worker*> by_id_;          // the same by id, for lookups
  std::vector<Candidate> board_;                         // parallel to order_
  // The distinct limits of Scheduler::fits among the workers (one per
  // cluster of alike workers): a pick asks each class once, not each worker.
  std::vector<SchedulerOptions> fit_classes_;
  std::vector<char> class_fits_;                         // pick()'s buffer, per fit class
  std::vector<uint64_t> ids_;                            // schedule()'s buffer
  std::vector<Unplaced> unplaced_;                       // in arrival order
  std::unordered_map<uint64_t, uint64_t> where_;         // request -> worker (0 = unplaced)
  uint64_t rr_next_ = 0;
  std::vector<RequestEvent> events_;
  std::vector<RequestEvent> collected_;  // collect()'s buffer, swapped with the schedulers'
  // The first blocks every worker caches (prefix-affinity asks only their
  // holders); behind a pointer so the workers' observers outlive a move.
  std::unique_ptr<PrefixRootIndex> roots_ = std::make_unique<PrefixRootIndex>();
  BatcherCounters counters_;
};

}  // namespace troupe::core
