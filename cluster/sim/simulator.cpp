#include "cluster/sim/simulator.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "cluster/sim/event_queue.hpp"
#include "cluster/sim/parse_number.hpp"
#include "cluster/sim/table_checker.hpp"
#include "core/sequence_table.hpp"
#include "core/step_cost.hpp"
#include "core/splitmix.hpp"

namespace troupe::cluster::sim {
namespace {

// One work item as it runs on a simulated worker.
struct Item {
  uint64_t seq;
  int32_t start, n;
  bool sample;
};

struct Worker {
  uint64_t id = 0;
  const SimWorkerSpec* spec = nullptr;
  core::SequenceTable table;
  Channel down, up;                      // head -> worker, worker -> head
  std::deque<core::StepPlan> to_worker;  // on the wire, in order
  std::deque<core::StepPlan> queue;      // arrived, not started
  std::deque<core::StepResult> to_head;  // on the wire, in order
  bool busy = false;
  core::StepPlan current;
  uint64_t current_step = 0;
  core::PreparedStep prepared;
  std::vector<Item> items;                     // the current step's
  std::vector<core::SeqOutput> spare_outputs;  // a result's buffer, for the next step's
  int64_t started = 0;
  int64_t busy_ns = 0, busy_at_sample = 0;
  int64_t steps = 0, tokens_run = 0, refused = 0;
  int32_t peak_blocks = 0;
  double kv_use_sum = 0;
  bool hung = false;                // a fault stopped it: its steps never finish
  bool gone = false;                // the batcher let it go: its events are dropped
  bool dead = false;                // killed, not yet noticed by the head
  int64_t dead_at = 0;
  int64_t drain_fault = -1;         // draining: the fault's index (it leaves once drained)
  // Its link is down in [cut_from, cut_until): what either side sends then
  // leaves when it is back (ZeroMQ holds it; a resend of a lost frame, ~one
  // heartbeat, is not modelled).
  int64_t cut_from = 0, cut_until = 0;
  core::SchedulerStats last_stats;  // its scheduler's, when it went
  std::deque<core::Request> admitting;  // a parallel run's: placed on it, to join it in its lane

  explicit Worker(const SimWorkerSpec& s, uint64_t worker_id)
      : id(worker_id), spec(&s), table(table_options(s)) {}
  // Busy time up to `now` (a dead worker's ended at its death).
  int64_t busy_until(int64_t now) const {
    const int64_t end = dead ? std::min(now, dead_at) : now;
    return busy_ns + (busy ? std::max<int64_t>(0, end - started) : 0);
  }
  // When a message handed to its link at `now` leaves.
  int64_t departs(int64_t now) const { return now >= cut_from && now < cut_until ? cut_until : now; }
};

// Whether events of this kind belong to one worker (target = its index):
// a parallel run handles them in that worker's lane.
constexpr bool worker_event(EventKind k) { return k <= EventKind::kResultArrive || k == EventKind::kAdmit; }

// Where events are handled: the main context (every event of a serial run;
// a parallel run's arrivals and samples) or a lane (a parallel run's
// workers' own events: steps ending, plans and results arriving). Each has
// its clock, its buffers and its share of the run's counts.
struct Ctx {
  int64_t now = 0;                         // the time of the event being handled; the head's, past its queue
  int64_t event_time = 0;                  // that event's own time
  core::Batcher::Lane* lane = nullptr;     // a lane's: its batcher calls go through it
  std::vector<uint64_t> touched;           // workers whose state changed since they were last planned
  std::vector<uint64_t> planning;          // head_changed()'s: the touched workers it plans for
  std::vector<core::Dispatch> plans;       // head_changed()'s, reused
  std::vector<core::RequestEvent> events;  // drain_events()'s, reused
  // Counts, summed over the contexts (a lane's own, while it runs).
  int64_t handled = 0;   // events
  int64_t pending = 0;   // work events pushed minus handled
  int64_t finished = 0;  // requests
  int64_t outstanding = 0;
  int64_t owned = 0;  // a lane's: requests on its workers not finished
  int64_t tokens_in_interval = 0;
  int32_t finished_in_interval = 0;
};

// A parallel run's lane: the workers whose index is its index modulo the
// lanes, their events' queue, and what its batcher calls leave for the merge.
struct Lane {
  Ctx ctx;
  core::Batcher::Lane batcher;
  EventQueue queue;
  bool stopped = false;  // at its last request (run_lane's `last`)
  Event last_finish;     // the event that finished its last request then
  Event last_handled;    // the last event it handled
  // With the tables put off (Simulation::tables_later_): the plans its
  // workers started, not yet checked by their tables, oldest first, checked
  // by the lane's own thread when it has nothing else to do.
  std::deque<std::pair<size_t, core::StepPlan>> unchecked;  // (worker index, plan)
  std::vector<core::SeqFailure> failures;                   // check_plan's buffer
  bool refused = false;                                     // a table refused an item
  std::exception_ptr error;  // a check threw (rethrown when the run ends)
};

// Spins until `ready` holds: a phase is tens of microseconds of work, which
// a sleep and a wake-up would cost as much as.
template <typename Ready>
void spin_until(const Ready& ready) {
  for (uint32_t spins = 0; !ready(); ++spins) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (spins > 4096) std::this_thread::yield();  // the other side is not running: give it the CPU
  }
}

// spin_until(done), running `idle` meanwhile until it says there is nothing
// to do.
template <typename Done>
void spin_until_idling(const Done& done, const std::function<bool()>& idle) {
  bool busy = true;
  spin_until([&] {
    if (done()) return true;
    busy = busy && idle();
    return false;
  });
}

// Prompts of the arrivals to come, built ahead by whichever thread has
// nothing else to do (a lane's thread between phases, the main one while it
// waits for the other lane): a prompt is microseconds that the run's serial
// part, the arrival, would otherwise spend. Arrivals take them in order.
class PromptsAhead {
 public:
  PromptsAhead(size_t n, std::function<std::vector<int32_t>(size_t)> build)
      : n_(n), build_(std::move(build)) {}
  // Builds the next prompt due, if a slot is free for it; false when there
  // was nothing to do.
  bool build_one() {
    size_t i = claimed_.load(std::memory_order_acquire);
    if (i >= n_ || i >= taken_.load(std::memory_order_acquire) + kAhead) return false;
    if (!claimed_.compare_exchange_strong(i, i + 1, std::memory_order_acq_rel))
      return true;  // another took it
    Slot& s = slots_[i % kAhead];
    try {
      s.tokens = build_(i);
      s.failed = false;
    } catch (...) {
      s.failed = true;  // take() builds it again, on its thread, and throws there
    }
    s.ready.store(static_cast<int64_t>(i), std::memory_order_release);
    return true;
  }
  // Prompt i, the next one in order: built ahead, or built now.
  std::vector<int32_t> take(size_t i) {
    if (i != taken_.load(std::memory_order_relaxed)) throw std::logic_error("PromptsAhead: out of order");
    size_t c = i;
    std::vector<int32_t> tokens;
    if (claimed_.compare_exchange_strong(c, i + 1, std::memory_order_acq_rel)) {
      tokens = build_(i);  // nobody had started it
    } else {
      Slot& s = slots_[i % kAhead];
      spin_until([&] { return s.ready.load(std::memory_order_acquire) == static_cast<int64_t>(i); });
      tokens = s.failed ? build_(i) : std::move(s.tokens);
    }
    taken_.store(i + 1, std::memory_order_release);
    return tokens;
  }

 private:
  static constexpr size_t kAhead = 16;
  struct Slot {
    std::atomic<int64_t> ready{-1};  // the index whose prompt it holds
    std::vector<int32_t> tokens;
    bool failed = false;  // building it threw
  };
  const size_t n_;
  std::function<std::vector<int32_t>(size_t)> build_;
  std::array<Slot, kAhead> slots_;
  std::atomic<size_t> claimed_{0};  // the next index to build
  std::atomic<size_t> taken_{0};    // prompts taken: the slots of those below are free
};

// Runs `work` on a thread of its own each time it is asked to, and `idle`
// while it waits (until that says there is nothing to do).
class PhaseThread {
 public:
  PhaseThread(std::function<void()> work, std::function<bool()> idle)
      : work_(std::move(work)), idle_(std::move(idle)), thread_([this] { loop(); }) {}
  ~PhaseThread() {
    quit_.store(true, std::memory_order_release);
    thread_.join();
  }
  PhaseThread(const PhaseThread&) = delete;
  PhaseThread& operator=(const PhaseThread&) = delete;
  void start() { asked_.store(asked_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  // Waits for the work asked for, running `idle` meanwhile; rethrows what it threw.
  void wait(const std::function<bool()>& idle) {
    const uint64_t n = asked_.load(std::memory_order_relaxed);
    spin_until_idling([&] { return done_.load(std::memory_order_acquire) == n; }, idle);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      spin_until_idling(
          [&] {
            return asked_.load(std::memory_order_acquire) != seen || quit_.load(std::memory_order_acquire);
          },
          idle_);
      if (asked_.load(std::memory_order_acquire) == seen) return;  // quit, nothing asked
      seen = asked_.load(std::memory_order_acquire);
      try {
        work_();
      } catch (...) {
        error_ = std::current_exception();
      }
      done_.store(seen, std::memory_order_release);
    }
  }
  std::function<void()> work_;
  std::function<bool()> idle_;
  std::atomic<uint64_t> asked_{0}, done_{0};
  std::atomic<bool> quit_{false};
  std::exception_ptr error_;  // written by the thread before done_ moves
  std::thread thread_;
};

// Faults after which a worker may join that a later fault can name: an add,
// a node back after a cut.
bool joins(const SimFault& f) { return f.kind == FaultKind::kAdd || f.kind == FaultKind::kCut; }
// And all after which one may join: those, and a hung worker started over.
bool adds_a_worker(const SimFault& f) { return joins(f) || f.kind == FaultKind::kHang; }

// The head's model of a worker's step time, for step deadlines: the
// worker's own cost model, as a head has an emulated worker's (its profile
// comes with it at register).
class KnownStepCost : public core::StepCostModel {
 public:
  explicit KnownStepCost(std::shared_ptr<const CostModel> cost) : cost_(std::move(cost)) {}
  int64_t predict_ns(const core::StepPlan& plan) override { return cost_->predict_ns(StepShape::of(plan)); }
  void observe(uint64_t, double) override {}

 private:
  std::shared_ptr<const CostModel> cost_;
};

// A message's size matters only on a link with a bandwidth (encoding every
// plan of an in-process worker would only slow the simulation down).
bool metered(const Worker& w) { return w.spec->link.bandwidth_bytes_per_s > 0; }

class Simulation {
 public:
  // tables_on_thread: the workers' tables run on a TableChecker (o.worker_tables).
  Simulation(const std::vector<WorkloadRequest>& workload, const SimOptions& o, bool tables_on_thread)
      : workload_(workload), o_(o), batcher_(o.batcher) {
    if (o.workers.empty()) throw std::invalid_argument("simulation: no workers");
    if (o.max_concurrency < 0) throw std::invalid_argument("simulation: max_concurrency must be >= 0");
    if (o.sample_interval_ns < 0) throw std::invalid_argument("simulation: sample_interval_ns must be >= 0");
    const HeadCost& h = o.head;
    if (!(h.request_ns >= 0 && h.step_ns >= 0 && h.token_ns >= 0 && h.idle_share >= 0 && h.idle_share < 1))
      throw std::invalid_argument("simulation: the head's costs must be >= 0 and its idle share in [0, 1)");
    head_costs_ = !h.free();
    max_model_len_ = std::numeric_limits<int32_t>::max();
    // Step deadlines matter only when a worker can hang or a link be cut;
    // predicting every plan's cost costs time otherwise.
    deadlines_ = std::any_of(o.faults.begin(), o.faults.end(), [](const SimFault& f) {
      return f.kind == FaultKind::kHang || f.kind == FaultKind::kCut;
    });
    const auto joining = static_cast<size_t>(std::count_if(o.faults.begin(), o.faults.end(), joins));
    // Never moves: Worker& stay valid as workers join.
    workers_.reserve(o.workers.size() +
                     static_cast<size_t>(std::count_if(o.faults.begin(), o.faults.end(), adds_a_worker)));
    for (size_t i = 0; i < o.workers.size(); ++i) {
      check_worker(o.workers[i], "worker " + std::to_string(i + 1));
      join(o.workers[i]);
    }
    const size_t n = workload.size();
    result_.requests.resize(n);
    result_.scheduled_ns.assign(n, -1);
    result_.cached_tokens.assign(n, 0);
    result_.worker.assign(n, 0);
    result_.sample_interval_ns = o.sample_interval_ns;
    std::vector<int64_t> arrivals(n);
    for (size_t i = 0; i < n; ++i) {
      const WorkloadRequest& r = workload[i];
      if (r.input_len < 1 || r.output_len < 1)
        throw std::invalid_argument("simulation: request " + std::to_string(i + 1) +
                                    " has an empty prompt or output");
      if (i > 0 && r.arrival_ns < workload[i - 1].arrival_ns)
        throw std::invalid_argument("simulation: the workload must be in arrival order");
      result_.requests[i].id = i + 1;
      arrivals[i] = r.arrival_ns;
    }
    events_.set_arrivals(std::move(arrivals));  // request i's arrival targets i
    m_.pending = static_cast<int64_t>(n);
    state_.assign(n, 0);
    if (!o.faults.empty()) {
      if (o.watchdog_interval_ns < 1) throw std::invalid_argument("simulation: watchdog_interval_ns must be >= 1");
      std::vector<SimFault> faults = o.faults;  // in time order: result_.faults' order
      std::stable_sort(faults.begin(), faults.end(),
                       [](const SimFault& a, const SimFault& b) { return a.at_ns < b.at_ns; });
      for (size_t i = 0; i < faults.size(); ++i) {
        const SimFault& f = faults[i];
        if (f.kind == FaultKind::kAdd) {
          if (!f.add) throw std::invalid_argument("simulation: an add names no worker to add");
          check_worker(*f.add, "an added worker");
        } else if (f.worker < 1 || f.worker > o.workers.size() + joining) {
          throw std::invalid_argument(
              "simulation: a fault names worker " + std::to_string(f.worker) + " of " +
              std::to_string(o.workers.size()) +
              (joining ? " (and up to " + std::to_string(joining) + " joining)" : ""));
        }
        if (f.kind == FaultKind::kCut && !(f.duration_ns > 0))
          throw std::invalid_argument("simulation: a cut must last > 0 s");
        if (f.kind == FaultKind::kCut && f.worker <= o.workers.size())
          check_cuttable(o.workers[f.worker - 1], f.worker);
        if (f.at_ns < 0) throw std::invalid_argument("simulation: a fault's time must be >= 0");
        if (o.node_loss_ns < 0) throw std::invalid_argument("simulation: node_loss_ns must be >= 0");
        result_.faults.push_back({f, -1, -1, 0, 0, 0});
        push_work(f.at_ns, EventKind::kFault, i);
      }
      result_.affected.assign(n, 0);
    }
    if (o.sample_interval_ns > 0) events_.push(o.sample_interval_ns, EventKind::kSample, 0);
    // Lanes where no event of one worker's reaches another's state but
    // through placement (an arrival, handled between the lanes' phases):
    // no faults, no concurrency limit, a free head, no step log.
    if (o.parallel && workers_.size() >= 2 && o.faults.empty() && o.max_concurrency == 0 && !head_costs_ &&
        !o.step_log && !o.schedule_all_workers) {
      lanes_ = std::vector<Lane>(2);
      for (Lane& l : lanes_) l.ctx.lane = &l.batcher;
      // The tables: put off to each lane's idle moments where the caller
      // takes a refusal as a reason to run again (tables_on_thread), else in line.
      tables_later_ = o.worker_tables && tables_on_thread;
      return;
    }
    if (o.worker_tables && tables_on_thread) {
      std::vector<core::SequenceTableOptions> tables;
      for (const SimWorkerSpec& x : o.workers) tables.push_back(table_options(x));
      checker_ = std::make_unique<TableChecker>(tables);
    }
  }

  // After run(), with the tables on a thread: whether one refused a work
  // item (the run then differs from one with the tables in line).
  bool tables_refused() const { return tables_refused_; }

  SimResult run() {
    const int64_t total = static_cast<int64_t>(workload_.size());
    if (lanes_.empty())
      run_serial(total);
    else
      run_lanes(total);
    if (checker_) tables_refused_ = !checker_->finish();
    if (o_.sample_interval_ns > 0 && (result_.series.empty() || result_.series.back().t_ns < m_.now))
      sample();
    for (SeriesPoint& p : result_.series) p.workers.resize(workers_.size());  // zero before a worker joined
    if (o_.progress) o_.progress(finished(), total);
    result_.end_ns = m_.now;
    result_.events = static_cast<uint64_t>(sum(&Ctx::handled));
    for (Worker& w : workers_) {
      WorkerReport r;
      r.id = w.id;
      r.node = w.spec->node;
      r.device = w.spec->device;
      r.num_blocks = w.spec->scheduler.num_blocks;
      r.busy_ns = w.busy_ns;
      r.steps = w.steps;
      r.tokens_run = w.tokens_run;
      const core::SchedulerStats st = w.gone ? w.last_stats : batcher_.scheduler(w.id)->stats();
      r.tokens_generated = st.tokens_generated;
      r.preemptions = st.preemptions;
      r.prefix_query_tokens = st.prefix_query_tokens;
      r.prefix_hit_tokens = st.prefix_hit_tokens;
      r.peak_blocks_used = w.peak_blocks;
      r.mean_kv_use = result_.series.empty() ? 0 : w.kv_use_sum / static_cast<double>(result_.series.size());
      r.refused_items = w.refused;
      result_.workers.push_back(std::move(r));
    }
    return std::move(result_);
  }

 private:
  // A count over every context.
  template <typename T>
  T sum(T Ctx::*field) const {
    T n = m_.*field;
    for (const Lane& l : lanes_) n += l.ctx.*field;
    return n;
  }
  int64_t finished() const { return sum(&Ctx::finished); }
  bool only_samples_left() const { return sum(&Ctx::pending) == 0; }
  [[noreturn]] void stalled(int64_t total) const {
    throw std::logic_error("simulation stalled at " + std::to_string(m_.now) + " ns with " +
                           std::to_string(total - finished()) + " requests unfinished");
  }
  void progress(int64_t total) {
    const int64_t handled = sum(&Ctx::handled);
    if (o_.progress && (handled >> 16) != (progress_at_ >> 16)) o_.progress(finished(), total);
    progress_at_ = handled;
  }

  // Every event in one queue, one at a time.
  void run_serial(int64_t total) {
    while (finished() < total) {
      if (events_.empty() || only_samples_left()) stalled(total);
      main_event(events_.pop(), total);
    }
  }

  // An event of the main queue, in the main context.
  void main_event(const Event& e, int64_t total) {
    m_.now = m_.event_time = e.time;
    ++m_.handled;
    // A head with a cost is one server: its events wait for it, in order.
    const bool at_head = head_costs_ && e.kind != EventKind::kStepDone && e.kind != EventKind::kPlanArrive &&
                         e.kind != EventKind::kSample;
    if (at_head && head_free_ > m_.now) {
      result_.head_max_wait_ns = std::max(result_.head_max_wait_ns, head_free_ - m_.now);
      m_.now = head_free_;
    }
    if (worker_event(e.kind))
      handle(m_, e);
    else
      handle_global(e, total);
    if (at_head) head_free_ = m_.now;  // charge() moved it on by the event's cost
    if (e.kind != EventKind::kSample) --m_.pending;
    progress(total);
  }

  // The workers' own events in two lanes on two threads, in phases: each
  // phase runs, in every lane, the events up to the next arrival or sample,
  // which then runs alone. Within a phase no worker's event reads or writes
  // another worker's state (each request is on one worker; what the batcher
  // shares waits in the lanes until the phase ends: Batcher::Lane), so every
  // lane handles its events as the serial run would, and the run's results
  // are the serial run's, bit for bit (tested). Each lane runs on its own
  // thread only (lane 0 on this one), and between phases each thread builds
  // the prompts of the next arrivals and checks its lane's put-off plans.
  void run_lanes(int64_t total) {
    PromptsAhead prompts(workload_.size(), [this](size_t i) { return build_prompt(sent(i), i, o_.prompts); });
    prompts_ = &prompts;
    struct Forget {
      PromptsAhead*& p;
      ~Forget() { p = nullptr; }
    } forget{prompts_};
    Phase phase;
    const auto idle = [&](Lane& l) { return prompts.build_one() || check_one(l); };
    const std::function<bool()> idle_main = [&] { return idle(lanes_[0]); };
    PhaseThread second([&] { run_phase(phase, lanes_[1]); }, [&] { return idle(lanes_[1]); });
    const auto both = [&](Phase p) {
      phase = p;
      second.start();
      try {
        run_phase(phase, lanes_[0]);
      } catch (...) {
        second.wait(idle_main);  // it uses what unwinding would take away
        throw;
      }
      second.wait(idle_main);
      merge_lanes();
    };
    // The serial run ends with the event that finished the last request: the
    // latest of the lanes' last finishing events and the main context's (a
    // request refused at its arrival). A lane that stopped at its own runs its
    // events before that one; then both lanes check what the tables put off.
    Event main_finish;  // the main context's last event that finished a request
    const auto end = [&] {
      Phase p;
      p.mode = Phase::kUntilEnd;
      p.end = main_finish;
      for (const Lane& l : lanes_)
        if (before(p.end, l.last_finish)) p.end = l.last_finish;
      both(p);
      m_.now = m_.event_time = p.end.time;
      p.mode = Phase::kCheck;
      both(p);
      for (const Lane& l : lanes_) {
        if (l.error) std::rethrow_exception(l.error);
        tables_refused_ = tables_refused_ || l.refused;
      }
    };
    for (;;) {
      const Event* g = events_.peek();
      Phase p;
      p.limit = g != nullptr ? g->time : std::numeric_limits<int64_t>::max();
      p.last = events_.arrivals_left() == 0;  // no request left to send: a lane stops at its last one
      both(p);
      if (finished() >= total) return end();
      // A lane that stopped at its last request runs on to the limit: others remain.
      if (std::any_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.stopped; })) {
        for (Lane& l : lanes_) l.stopped = false;
        p.last = false;
        both(p);
      }
      if (g == nullptr || only_samples_left()) stalled(total);
      const Event e = events_.pop();
      const int64_t finished_before = m_.finished;
      main_event(e, total);
      if (m_.finished != finished_before) main_finish = e;
      if (finished() >= total) return end();
    }
  }

  // What a phase asks of each lane.
  struct Phase {
    enum Mode { kRun, kUntilEnd, kCheck } mode = kRun;
    int64_t limit = 0;  // kRun: its events at or before this time
    bool last = false;  // kRun: no arrival is left (it stops at its last request)
    Event end;          // kUntilEnd: the run's last event
  };
  // An event comes before another (by time and kind).
  static bool before(const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.kind < b.kind;
  }

  void run_phase(const Phase& p, Lane& l) {
    switch (p.mode) {
      case Phase::kRun:
        return run_lane(l, p.limit, p.last);
      case Phase::kUntilEnd:
        // Only a lane that stopped at its last request has events before the
        // run's last one; none after it may have run (a lane without requests
        // has no events: every simulated request runs to its length).
        if (!l.stopped && before(p.end, l.last_handled))
          throw std::logic_error("simulation: a lane ran past the run's last event");
        while (const Event* n = l.queue.peek()) {
          if (!before(*n, p.end)) break;
          run_one(l, l.queue.pop());
        }
        return;
      case Phase::kCheck:
        while (check_one(l)) {
        }
        return;
    }
  }

  // Lane l's events at or before `limit` (every worker event at a time comes
  // before the arrivals and samples at it). With `last`, it stops after the
  // event that finishes its last request.
  void run_lane(Lane& l, int64_t limit, bool last) {
    while (const Event* n = l.queue.peek()) {
      if (n->time > limit) break;
      const int64_t owned = l.ctx.owned;
      run_one(l, l.queue.pop());
      if (l.ctx.owned == 0 && owned > 0) {
        l.last_finish = l.last_handled;
        if (last) {
          l.stopped = true;
          return;
        }
      }
    }
  }
  void run_one(Lane& l, const Event& e) {
    l.ctx.now = l.ctx.event_time = e.time;
    if (e.kind != EventKind::kAdmit) ++l.ctx.handled;  // (the arrival's second half, counted with it)
    handle(l.ctx, e);
    --l.ctx.pending;
    l.last_handled = e;
  }

  // Checks one plan that lane l's tables put off; false when none waits.
  bool check_one(Lane& l) {
    if (l.unchecked.empty()) return false;
    auto& [index, plan] = l.unchecked.front();
    try {
      if (!l.refused && !l.error && !check_plan(workers_[index].table, plan, l.failures)) l.refused = true;
    } catch (...) {
      l.error = std::current_exception();  // (an idle moment must not throw)
    }
    l.unchecked.pop_front();
    return true;
  }

  void merge_lanes() {
    for (Lane& l : lanes_) batcher_.merge(l.batcher);
  }

  // A worker's event, in its context.
  void handle(Ctx& c, const Event& e) {
    switch (e.kind) {
      case EventKind::kStepDone:
        step_done(c, workers_[e.target]);
        break;
      case EventKind::kPlanArrive:
        plan_arrives(c, workers_[e.target]);
        break;
      case EventKind::kResultArrive:
        result_arrives(c, workers_[e.target]);
        break;
      case EventKind::kAdmit:
        admit(c, workers_[e.target]);
        break;
      default:
        throw std::logic_error("simulation: not a worker's event");
    }
  }

  // Any other event, in the main context.
  void handle_global(const Event& e, int64_t total) {
    switch (e.kind) {
      case EventKind::kDeadline:
        if (deadline_ && *deadline_ == m_.event_time) deadline_.reset();
        head_changed(m_);
        break;
      case EventKind::kFault:
        fault(e.target);
        break;
      case EventKind::kWatchdog:
        watchdog();
        break;
      case EventKind::kArrival:
        arrival(e.target);
        break;
      case EventKind::kSample:
        sample();
        if (finished() < total) events_.push(m_.now + o_.sample_interval_ns, EventKind::kSample, 0);
        break;
      default:
        throw std::logic_error("simulation: a worker's event in the main context");
    }
  }

  // Worker `index`'s lane: even and odd workers (contiguous halves and
  // blocks of 8 measured the same).
  Lane& lane_of(size_t index) { return lanes_[index % lanes_.size()]; }

  // Worker events go to their worker's lane in a parallel run.
  void push_work(Ctx& c, int64_t time, EventKind kind, uint64_t target) {
    EventQueue& q = lanes_.empty() || !worker_event(kind) ? events_ : lane_of(target).queue;
    q.push(time, kind, target);
    ++c.pending;
  }
  void push_work(int64_t time, EventKind kind, uint64_t target) { push_work(m_, time, kind, target); }

  // The head spends `cpu_ns` of its CPU on the event it is handling: what it
  // does after happens that much later (SimOptions::head).
  void charge(Ctx& c, double cpu_ns) {
    const int64_t d = o_.head.service_ns(cpu_ns);
    c.now += d;
    result_.head_busy_ns += d;  // (a serial run's only)
  }

  void arrival(size_t i) {
    client_clock_ = m_.event_time;  // the client sends it now, whether or not the head is free
    client_queue_.push_back(i);
    if (o_.max_concurrency > 0 && sum(&Ctx::outstanding) >= o_.max_concurrency) return;
    head_changed(m_);
  }

  // Sends held-back requests while the concurrency limit allows.
  bool release_clients() {
    bool sent = false;
    while (!client_queue_.empty() &&
           (o_.max_concurrency == 0 || sum(&Ctx::outstanding) < o_.max_concurrency)) {
      const size_t i = client_queue_.front();
      client_queue_.pop_front();
      send(i);
      sent = true;
    }
    return sent;
  }

  // Whether the client shortens request w to the workers' context.
  bool clipped(const WorkloadRequest& w) const {
    return static_cast<int64_t>(w.input_len) + w.output_len > max_model_len_ &&
           o_.overlong == OverlongPolicy::kClip;
  }
  // Request i as the client sends it: clipped to the workers' context when
  // it is longer and the policy clips.
  WorkloadRequest sent(size_t i) const {
    WorkloadRequest w = workload_[i];
    if (clipped(w)) {
      w.output_len = std::min(w.output_len, max_model_len_ - 1);
      w.input_len = std::max(1, std::min(w.input_len, max_model_len_ - w.output_len));
    }
    return w;
  }

  void send(size_t i) {
    const WorkloadRequest w = sent(i);
    if (clipped(workload_[i])) ++result_.clipped;
    core::Request r;
    r.id = i + 1;
    r.prompt_ids = prompts_ != nullptr ? prompts_->take(i) : build_prompt(w, i, o_.prompts);
    r.max_tokens = w.output_len;
    r.ignore_eos = true;
    r.sampling.temperature = 0;  // greedy, as the cost profile measured
    r.seed = i;
    core::RequestTiming& t = result_.requests[i];
    t.start_ns = head_costs_ ? client_clock_ : m_.now;
    t.prompt_tokens = w.input_len;
    t.token_ns.reserve(static_cast<size_t>(w.output_len));  // one allocation of its final size
    ++m_.outstanding;
    state_[i] = 1;
    if (head_costs_) charge(m_, o_.head.request_ns);
    uint64_t worker = 0;
    // A parallel run places the request now (placement reads every worker)
    // and its worker's lane admits it, in the next phase, at this time.
    if (auto err = lanes_.empty() ? batcher_.submit(std::move(r), m_.now) : batcher_.choose(r, worker)) {
      t.success = false;
      t.error = *err;
      t.end_ns = m_.now;
      done(m_, i);
      return;
    }
    if (lanes_.empty()) {
      m_.touched.push_back(batcher_.worker_of(i + 1));
      return;
    }
    workers_[worker - 1].admitting.push_back(std::move(r));
    ++lane_of(worker - 1).ctx.owned;
    push_work(m_.now, EventKind::kAdmit, worker - 1);
  }

  // A parallel run's: the request placed on w at an arrival joins it.
  void admit(Ctx& c, Worker& w) {
    batcher_.admit(w.id, std::move(w.admitting.front()), *c.lane);
    w.admitting.pop_front();
    c.touched.push_back(w.id);
    head_changed(c);
  }

  void done(Ctx& c, size_t i) {
    if (c.lane == nullptr) client_clock_ = c.now;  // the client hears of it now, and may send the next
    state_[i] = 2;
    --c.outstanding;
    --c.owned;
    ++c.finished;
    ++c.finished_in_interval;
  }

  // Something changed at the head: send what clients may send, plan for the
  // workers whose state changed, record what happened; again while finished
  // requests free clients. In a lane: only the lane's workers are touched,
  // and no client waits (a parallel run has no concurrency limit).
  void head_changed(Ctx& c) {
    const bool main = c.lane == nullptr;
    if (main) release_clients();
    do {
      std::vector<uint64_t>& ids = c.planning;  // c.touched's ids; c.touched collects the next ones
      ids.swap(c.touched);
      c.touched.clear();
      if (o_.schedule_all_workers || ids.empty()) ids.assign(1, 0);  // 0: requests waiting for a worker only
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      for (uint64_t id : ids) {
        if (id != 0 && !batcher_.has_worker(id)) continue;  // gone since it was touched
        if (o_.schedule_all_workers)
          c.plans = batcher_.schedule(c.now);
        else if (!main && id == 0)
          continue;  // nothing waits for a worker in a lane's run
        else if (!main)
          batcher_.schedule(c.now, id, c.plans, *c.lane);
        else
          batcher_.schedule(c.now, id, c.plans);
        for (core::Dispatch& d : c.plans) {
          Worker& w = workers_[d.worker - 1];
          if (o_.step_log) o_.step_log->planned(d.worker, d.plan);
          const int64_t arrive =
              w.down.send(w.departs(c.now), metered(w) ? plan_wire_bytes(d.plan) : 0, w.spec->link);
          w.to_worker.push_back(std::move(d.plan));
          push_work(c, arrive, EventKind::kPlanArrive, d.worker - 1);
        }
      }
      drain_events(c);
    } while (main && release_clients());
    if (!main) return;
    if (auto d = batcher_.next_deadline(); d && (!deadline_ || *d < *deadline_)) {
      deadline_ = std::max(*d, c.now);  // the timer's time: the kDeadline event clears it
      push_work(*deadline_, EventKind::kDeadline, 0);
    }
  }

  void drain_events(Ctx& c) {
    if (c.lane != nullptr) {
      c.events.clear();
      c.events.swap(c.lane->events);  // the lane's buffer goes back to it for the next ones
    } else {
      batcher_.take_events(c.events);
    }
    for (core::RequestEvent& ev : c.events) {
      const size_t i = ev.request_id - 1;
      core::RequestTiming& t = result_.requests[i];
      switch (ev.kind) {
        case core::EventKind::kScheduled:
          if (result_.scheduled_ns[i] < 0) {
            result_.scheduled_ns[i] = c.now;
            result_.cached_tokens[i] = ev.usage.cached_tokens;
            result_.worker[i] = batcher_.worker_of(ev.request_id);
          }
          break;
        case core::EventKind::kPromptLogprobs:  // the simulated workloads ask for none
          break;
        case core::EventKind::kToken:
          t.token_ns.push_back(c.now);
          ++c.tokens_in_interval;
          break;
        case core::EventKind::kFinished: {
          t.end_ns = c.now;
          t.output_tokens = ev.usage.completion_tokens;
          t.success =
              ev.finish_reason == core::FinishReason::kLength || ev.finish_reason == core::FinishReason::kEos;
          if (!t.success) t.error = ev.error.empty() ? core::to_string(ev.finish_reason) : ev.error;
          done(c, i);
          break;
        }
      }
    }
  }

  void check_worker(const SimWorkerSpec& s, const std::string& what) const {
    if (!s.cost) throw std::invalid_argument("simulation: " + what + " has no cost model");
    if (s.link.latency_ns < 0 || s.link.bandwidth_bytes_per_s < 0)
      throw std::invalid_argument("simulation: network latency and bandwidth must be >= 0");
    if (s.table_blocks < 0) throw std::invalid_argument("simulation: table_blocks must be >= 0");
  }
  static void check_cuttable(const SimWorkerSpec& s, uint64_t id) {
    if (s.link.in_process())
      throw std::invalid_argument("simulation: worker " + std::to_string(id) +
                                  " runs in the head's process: it has no link to cut (give it a network)");
  }

  // A worker joins the batcher under the next id (its node registered).
  uint64_t join(const SimWorkerSpec& s) {
    core::WorkerSpec w;
    w.id = workers_.size() + 1;
    w.node = s.node;
    w.device = s.device;
    w.scheduler = s.scheduler;
    w.scheduler.seed = core::splitmix64(o_.seed ^ (w.id * 0x51ed));
    w.scheduler.hash_key = core::splitmix64(o_.seed ^ 0x4a54) | 1;  // fixed (0 draws a random key)
    if (deadlines_) w.cost = std::make_shared<KnownStepCost>(s.cost);
    if (auto err = batcher_.add_worker(w)) throw std::invalid_argument("simulation: " + *err);
    workers_.emplace_back(s, w.id);
    max_model_len_ = std::min(max_model_len_, s.scheduler.max_model_len);
    return w.id;
  }
  // A worker joins a running simulation: the head plans for it at once.
  uint64_t join_running(const SimWorkerSpec& s) {
    const uint64_t id = join(s);
    m_.touched.push_back(id);
    head_changed(m_);
    return id;
  }

  // Faults. The requests a fault takes off its worker are the affected ones.
  std::vector<size_t> requests_on(uint64_t worker) const {
    std::vector<size_t> out;
    for (size_t i = 0; i < state_.size(); ++i)
      if (state_[i] == 1 && batcher_.worker_of(i + 1) == worker) out.push_back(i);
    return out;
  }

  // What the batcher did about one fault: its counters' growth since `before`.
  void record(FaultReport& f, const core::BatcherCounters& before, const std::vector<size_t>& moved) {
    f.requests_moved += static_cast<int32_t>(batcher_.counters().requests_moved - before.requests_moved);
    f.tokens_recomputed += batcher_.counters().tokens_recomputed - before.tokens_recomputed;
    for (size_t i : moved)
      if (state_[i] == 1 && batcher_.worker_of(i + 1) != f.fault.worker) result_.affected[i] = 1;
  }

  // Every live worker may have work now (moved requests wait in their schedulers).
  void touch_all() {
    for (const Worker& w : workers_)
      if (!w.gone) m_.touched.push_back(w.id);
  }

  void let_go(Worker& w) {
    w.gone = true;
    w.to_worker.clear();
    w.queue.clear();
    w.to_head.clear();
    w.busy_ns = w.busy_until(m_.now);
    w.busy = false;
  }

  // Event targets: k strikes fault k; F + k is the head losing its worker
  // (a kill's or a long cut's silence); 2F + k a cut link coming back.
  void fault(size_t k) {
    const size_t nf = result_.faults.size();
    if (k >= 3 * nf) return registers_again(k - 3 * nf);
    if (k >= 2 * nf) return link_back(k - 2 * nf);
    if (k >= nf) return node_lost(k - nf);
    FaultReport& f = result_.faults[k];
    if (f.fault.kind == FaultKind::kAdd) {
      f.fault.worker = join_running(*f.fault.add);
      return;
    }
    if (f.fault.worker > workers_.size()) return;  // not (yet) there
    Worker& w = workers_[f.fault.worker - 1];
    if (f.fault.kind == FaultKind::kCut) return cut(k, w);
    if (w.gone || w.dead || (w.hung && f.fault.kind != FaultKind::kKill)) return;
    if (f.fault.kind == FaultKind::kHang || (f.fault.kind == FaultKind::kKill && o_.node_loss_ns > 0)) {
      // It stops now (no step ends, a dead one sends nothing); the head
      // finds out later: the step deadline (watchdog()), the silence (node_lost()).
      w.hung = true;
      if (f.fault.kind == FaultKind::kKill) {
        w.dead = true;
        w.dead_at = m_.event_time;
        push_work(m_.event_time + o_.node_loss_ns, EventKind::kFault, result_.faults.size() + k);
      } else {
        watch(k);
      }
      return;
    }
    const core::BatcherCounters before = batcher_.counters();
    const std::vector<size_t> on = requests_on(w.id);
    if (f.fault.kind == FaultKind::kKill) {  // noticed at once (node_loss_ns 0)
      w.last_stats = batcher_.scheduler(w.id)->stats();
      batcher_.remove_worker(w.id, m_.now, core::WorkerExit::kLost);
      let_go(w);
      f.removed_ns = m_.now;
    } else {
      batcher_.drain_worker(w.id);
      w.drain_fault = static_cast<int64_t>(k);
    }
    record(f, before, on);
    leave_if_drained(w);
    touch_all();
    head_changed(m_);
  }

  // A drained worker leaves (its node exits), as the real one does.
  void leave_if_drained(Worker& w) {
    if (w.drain_fault < 0 || w.gone || !batcher_.drained(w.id)) return;
    w.last_stats = batcher_.scheduler(w.id)->stats();
    batcher_.remove_worker(w.id, m_.now, core::WorkerExit::kDrained);
    let_go(w);
    result_.faults[static_cast<size_t>(w.drain_fault)].removed_ns = m_.now;
  }

  // The watchdog checks step deadlines while fault k may need it.
  void watch(size_t k) {
    watched_.push_back(k);
    if (!watchdog_on_) {
      watchdog_on_ = true;
      push_work(m_.now + o_.watchdog_interval_ns, EventKind::kWatchdog, 0);
    }
  }
  bool watching(size_t k) const {
    const FaultReport& f = result_.faults[k];
    const Worker& w = workers_[f.fault.worker - 1];
    return !w.gone && (f.fault.kind == FaultKind::kHang || m_.now < f.fault.at_ns + f.fault.duration_ns);
  }

  // The link to w goes down for the fault's duration. The head hears nothing
  // from the node meanwhile: past the liveness window it loses it
  // (node_lost), and the node, its head silent as long, starts over.
  void cut(size_t k, Worker& w) {
    const FaultReport& f = result_.faults[k];
    if (w.gone || w.dead || w.hung || m_.event_time < w.cut_until) return;
    check_cuttable(*w.spec, w.id);
    w.cut_from = m_.event_time;
    w.cut_until = m_.event_time + f.fault.duration_ns;
    const size_t nf = result_.faults.size();
    if (f.fault.duration_ns >= o_.node_loss_ns)
      push_work(m_.event_time + o_.node_loss_ns, EventKind::kFault, nf + k);
    push_work(w.cut_until, EventKind::kFault, 2 * nf + k);
    watch(k);
  }

  // A cut link is back. Its held messages are on their way (their events were
  // pushed when they were sent); a node the head let go meanwhile (lost, or
  // hung past a step deadline: the head's reset reaches it now) registers
  // again as a new worker, with an empty KV cache.
  void link_back(size_t k) {
    FaultReport& f = result_.faults[k];
    const Worker& w = workers_[f.fault.worker - 1];
    f.returned_ns = m_.now;
    if (!w.gone || w.dead || w.hung || w.drain_fault >= 0) return;  // only delayed, or gone for good
    registers_again(k);
  }

  // A worker the head let go as hung starts over, as the real cluster does
  // (docs/protocol.md, "Step deadlines"): a node, told by the head's reset,
  // registers again with a fresh worker once the reset and its register
  // have crossed the link; a worker in the head's process is restarted at
  // once, at most kLocalRestarts times in a run. Either joins under a new id
  // with an empty KV cache.
  static constexpr int kLocalRestarts = 3;
  void hung_let_go(size_t k, const Worker& w) {
    if (w.spec->link.in_process()) {
      if (local_restarts_ >= kLocalRestarts) return;
      ++local_restarts_;
      return registers_again(k);
    }
    push_work(m_.now + 2 * w.spec->link.latency_ns, EventKind::kFault, 3 * result_.faults.size() + k);
  }
  // Fault k's worker, let go, is back under a new id (a cut's node, a hung one started over).
  void registers_again(size_t k) {
    FaultReport& f = result_.faults[k];
    f.returned_ns = m_.now;
    f.new_worker = join_running(*workers_[f.fault.worker - 1].spec);
  }

  // The head notices a killed worker's silence (its heartbeats stopped).
  void node_lost(size_t k) {
    FaultReport& f = result_.faults[k];
    Worker& w = workers_[f.fault.worker - 1];
    if (w.gone) return;  // the step deadline found it first
    const core::BatcherCounters before = batcher_.counters();
    const std::vector<size_t> on = requests_on(w.id);
    w.last_stats = batcher_.scheduler(w.id)->stats();
    batcher_.remove_worker(w.id, m_.now, core::WorkerExit::kLost);
    let_go(w);
    f.removed_ns = m_.now;
    record(f, before, on);
    touch_all();
    head_changed(m_);
  }

  // The step deadlines: a hung worker is let go when its oldest step is past
  // its deadline (Batcher::take_hung), its requests moved.
  void watchdog() {
    std::vector<std::pair<size_t, std::vector<size_t>>> on;  // watched fault -> requests on its worker
    for (size_t k : watched_) {
      Worker& w = workers_[result_.faults[k].fault.worker - 1];
      if (!watching(k)) continue;
      w.last_stats = batcher_.scheduler(w.id)->stats();
      on.emplace_back(k, requests_on(w.id));
    }
    const core::BatcherCounters before = batcher_.counters();
    const std::vector<core::HungWorker> hung = batcher_.take_hung(m_.now);
    for (const core::HungWorker& h : hung) {
      Worker& w = workers_[h.worker - 1];
      // A worker no fault struck, past its deadline (a cost model far off): no stats kept.
      if (std::none_of(on.begin(), on.end(),
                       [&](const auto& x) { return result_.faults[x.first].fault.worker == h.worker; }))
        w.last_stats = {};
      let_go(w);
      for (auto& [k, reqs] : on) {
        FaultReport& f = result_.faults[k];
        if (f.fault.worker != h.worker || f.removed_ns >= 0) continue;
        f.removed_ns = m_.now;
        // One batcher call may let several workers go: count each one's own requests.
        core::BatcherCounters mine = before;
        if (hung.size() > 1) {
          int64_t tokens = 0;
          for (size_t i : reqs) tokens += result_.requests[i].prompt_tokens + static_cast<int64_t>(result_.requests[i].token_ns.size());
          mine.requests_moved = batcher_.counters().requests_moved - static_cast<int64_t>(reqs.size());
          mine.tokens_recomputed = batcher_.counters().tokens_recomputed - tokens;
        }
        record(f, mine, reqs);
        if (f.fault.kind == FaultKind::kHang) hung_let_go(k, w);
        break;  // one fault's
      }
    }
    watched_.erase(std::remove_if(watched_.begin(), watched_.end(), [&](size_t k) { return !watching(k); }),
                   watched_.end());
    watchdog_on_ = !watched_.empty();
    if (watchdog_on_) push_work(m_.now + o_.watchdog_interval_ns, EventKind::kWatchdog, 0);
    if (!hung.empty()) {
      touch_all();
      head_changed(m_);
    }
  }

  void plan_arrives(Ctx& c, Worker& w) {
    if (w.gone) return;
    w.queue.push_back(std::move(w.to_worker.front()));
    w.to_worker.pop_front();
    if (!w.busy && !w.dead) start(c, w);
  }

  // Appends one of the step's items to w.items, field by field: a braced
  // temporary would be built on the stack by narrow stores and copied by
  // wide loads, which the store buffer cannot forward (a stall per item).
  static void add_item(Worker& w, uint64_t seq, int32_t start, int32_t n, bool sample) {
    Item& i = w.items.emplace_back();
    i.seq = seq;
    i.start = start;
    i.n = n;
    i.sample = sample;
  }

  void start(Ctx& c, Worker& w) {
    w.current = std::move(w.queue.front());
    w.queue.pop_front();
    // What runs: the plan as the worker's SequenceTable resolves it (items it
    // refuses do not run), or, without tables, the plan's work as it stands.
    w.items.clear();
    w.current_step = w.current.step_id;
    if (o_.worker_tables && !checker_ && !tables_later_) {
      w.table.prepare(w.current, w.prepared);
      for (const core::SeqChunk& k : w.prepared.chunks)
        add_item(w, k.seq_id, k.start_pos, static_cast<int32_t>(k.token_ids.size()), k.sample);
    } else {
      for (const core::SeqWork& x : w.current.work)
        add_item(w, x.seq_id, x.start_pos, x.num_tokens, x.sample);
      if (checker_) checker_->submit(w.id - 1, w.current);
      if (tables_later_) {
        Lane& l = lane_of(w.id - 1);
        l.unchecked.emplace_back(w.id - 1, std::move(w.current));  // (not used after this)
        if (l.unchecked.size() > kMostUnchecked) check_one(l);     // no time was idle: memory stays bounded
      }
    }
    w.busy = true;
    w.started = c.now;
    StepShape shape;
    for (const Item& i : w.items) shape.add(i.start, i.n, i.sample);
    push_work(c, c.now + std::max<int64_t>(1, w.spec->cost->predict_ns(shape)), EventKind::kStepDone,
              w.id - 1);
  }

  void step_done(Ctx& c, Worker& w) {
    if (w.gone || w.hung) return;  // a hung worker's step never ends
    core::StepResult r;
    r.step_id = w.current_step;
    r.outputs.swap(w.spare_outputs);  // an arrived result's buffer
    r.outputs.clear();
    r.outputs.reserve(w.items.size());
    const int32_t vocab = w.spec->scheduler.vocab_size;
    for (const Item& i : w.items) {
      w.tokens_run += i.n;
      if (i.sample) r.outputs.push_back({i.seq, {fake_token(i.seq, i.start + i.n, vocab), 0.0f, {}, 0}});
    }
    if (o_.worker_tables && !checker_ && !tables_later_) {
      w.refused += static_cast<int64_t>(w.prepared.failures.size());
      r.failures = std::move(w.prepared.failures);
      w.table.commit(w.prepared, r.outputs, {});
    }
    r.forward_ms = static_cast<double>(c.now - w.started) / 1e6;
    w.busy_ns += c.now - w.started;
    w.busy = false;
    ++w.steps;
    const int64_t arrive = w.up.send(w.departs(c.now), metered(w) ? result_wire_bytes(r) : 0, w.spec->link);
    w.to_head.push_back(std::move(r));
    push_work(c, arrive, EventKind::kResultArrive, w.id - 1);
    if (!w.queue.empty()) start(c, w);
  }

  void result_arrives(Ctx& c, Worker& w) {
    if (w.gone) return;  // sent before it went; the head drops it
    core::StepResult r = std::move(w.to_head.front());
    w.to_head.pop_front();
    if (head_costs_) charge(c, o_.head.step_ns + o_.head.token_ns * static_cast<double>(r.outputs.size()));
    if (o_.step_log) o_.step_log->done(w.id, r);
    const std::optional<std::string> err =
        c.lane != nullptr ? batcher_.on_result(w.id, r, c.now, *c.lane) : batcher_.on_result(w.id, r, c.now);
    if (err) throw std::logic_error("simulation: " + *err);
    w.spare_outputs = std::move(r.outputs);
    c.touched.push_back(w.id);
    if (c.lane == nullptr) leave_if_drained(w);  // (a lane's run drains no worker)
    head_changed(c);
  }

  void sample() {
    SeriesPoint p;
    p.t_ns = m_.now;
    p.waiting = batcher_.num_waiting();
    p.running = batcher_.num_running();
    p.client_queue = static_cast<int32_t>(client_queue_.size());
    p.output_tokens = sum(&Ctx::tokens_in_interval);
    p.finished = sum(&Ctx::finished_in_interval);
    m_.tokens_in_interval = 0;
    m_.finished_in_interval = 0;
    for (Lane& l : lanes_) l.ctx.tokens_in_interval = l.ctx.finished_in_interval = 0;
    const int64_t span = result_.series.empty() ? m_.now : m_.now - result_.series.back().t_ns;
    if (span > 0)
      p.head_busy = static_cast<double>(result_.head_busy_ns - head_busy_at_sample_) / static_cast<double>(span);
    head_busy_at_sample_ = result_.head_busy_ns;
    for (Worker& w : workers_) {
      SeriesPoint::Worker x;
      const int64_t busy = w.busy_until(m_.now);
      x.busy = span > 0 ? static_cast<double>(busy - w.busy_at_sample) / static_cast<double>(span) : 0.0;
      w.busy_at_sample = busy;
      if (w.gone) {  // nothing running, no blocks
        p.workers.push_back(x);
        continue;
      }
      const core::Scheduler& s = *batcher_.scheduler(w.id);
      x.blocks_used = s.allocator().num_used();
      x.running = s.num_running();
      x.waiting = s.num_waiting();
      x.preemptions = s.stats().preemptions;
      w.peak_blocks = std::max(w.peak_blocks, x.blocks_used);
      w.kv_use_sum += static_cast<double>(x.blocks_used) / w.spec->scheduler.num_blocks;
      p.workers.push_back(x);
    }
    result_.series.push_back(std::move(p));
  }

  const std::vector<WorkloadRequest>& workload_;
  const SimOptions& o_;
  core::Batcher batcher_;
  std::vector<Worker> workers_;
  EventQueue events_;
  SimResult result_;
  Ctx m_;                            // the main context
  std::vector<Lane> lanes_;          // a parallel run's (none: serial)
  PromptsAhead* prompts_ = nullptr;  // a parallel run's, while it runs
  bool tables_later_ = false;        // a parallel run's tables check plans when their lane is idle
  static constexpr size_t kMostUnchecked = 4096;  // plans a lane may hold unchecked
  int64_t progress_at_ = 0;                       // events handled when progress() last looked
  bool head_costs_ = false;     // SimOptions::head is not free
  int64_t head_free_ = 0;       // when the head is done with the events it has taken
  int64_t client_clock_ = 0;    // when clients last acted (sent, or heard a request end)
  int64_t head_busy_at_sample_ = 0;
  int32_t max_model_len_ = 0;
  std::deque<size_t> client_queue_;
  std::optional<int64_t> deadline_;
  std::unique_ptr<TableChecker> checker_;  // the tables on a thread, or none
  bool tables_refused_ = false;
  std::vector<char> state_;          // per request: 0 not sent, 1 outstanding, 2 done
  int local_restarts_ = 0;            // hung workers of the head's process restarted (hung_let_go)
  std::vector<size_t> watched_;      // the hangs not found out and cuts not over: the watchdog's
  bool watchdog_on_ = false;
  bool deadlines_ = false;  // the workers' step deadlines come from their cost models
};

}  // namespace

const char* to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::kKill:
      return "kill";
    case FaultKind::kHang:
      return "hang";
    case FaultKind::kDrain:
      return "drain";
    case FaultKind::kAdd:
      return "add";
    case FaultKind::kCut:
      return "cut";
  }
  return "?";
}

SimFault parse_fault(FaultKind kind, const std::string& text) {
  const size_t at = text.find('@');
  const auto bad = [&] {
    return std::invalid_argument("fault '" + text + "': expected WORKER@SECONDS, e.g. 3@30 (worker 3 at 30 s)");
  };
  if (at == std::string::npos || at == 0 || at + 1 >= text.size()) throw bad();
  const std::string id = text.substr(0, at), t = text.substr(at + 1);
  char* end = nullptr;
  const unsigned long long w = std::strtoull(id.c_str(), &end, 10);
  if (*end != '\0' || id.find_first_not_of("0123456789") != std::string::npos || w < 1) throw bad();
  const std::optional<double> s = parse_number(t);
  if (!s || *s < 0 || *s > 1e9) throw bad();
  return {kind, w, static_cast<int64_t>(std::llround(*s * 1e9))};
}

SimResult simulate(const std::vector<WorkloadRequest>& workload, const SimOptions& options) {
  if (workload.empty()) throw std::invalid_argument("simulation: the workload is empty");
  // The tables' thread has one table per worker it starts with: a run in
  // which workers join checks in line (the same result).
  if (options.worker_tables && options.tables_on_thread &&
      std::none_of(options.faults.begin(), options.faults.end(), adds_a_worker)) {
    Simulation s(workload, options, true);
    SimResult r = s.run();
    if (!s.tables_refused()) return r;
    // A table refused an item: run again with the tables in line, so that
    // the refusal shapes the run as it would on a real worker.
  }
  Simulation s(workload, options, false);
  return s.run();
}

double duration_s(const SimResult& r) {
  int64_t first = std::numeric_limits<int64_t>::max(), last = 0;
  for (const auto& t : r.requests) {
    first = std::min(first, t.start_ns);
    last = std::max(last, t.end_ns);
  }
  if (r.requests.empty()) return 1e-9;
  return static_cast<double>(std::max<int64_t>(1, last - first)) / 1e9;
}

}  // namespace troupe::cluster::sim
