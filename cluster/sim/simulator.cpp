#include "cluster/sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>

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
    pending_work_events_ = static_cast<int64_t>(n);
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
    while (finished_ < total) {
      if (events_.empty() || only_samples_left()) {
        throw std::logic_error("simulation stalled at " + std::to_string(now_) + " ns with " +
                               std::to_string(total - finished_) + " requests unfinished");
      }
      const Event e = events_.pop();
      now_ = event_time_ = e.time;
      ++result_.events;
      // A head with a cost is one server: its events wait for it, in order.
      const bool at_head = head_costs_ && e.kind != EventKind::kStepDone && e.kind != EventKind::kPlanArrive &&
                           e.kind != EventKind::kSample;
      if (at_head && head_free_ > now_) {
        result_.head_max_wait_ns = std::max(result_.head_max_wait_ns, head_free_ - now_);
        now_ = head_free_;
      }
      switch (e.kind) {
        case EventKind::kStepDone:
          step_done(workers_[e.target]);
          break;
        case EventKind::kPlanArrive:
          plan_arrives(workers_[e.target]);
          break;
        case EventKind::kResultArrive:
          result_arrives(workers_[e.target]);
          break;
        case EventKind::kDeadline:
          if (deadline_ && *deadline_ == event_time_) deadline_.reset();
          head_changed();
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
          if (finished_ < total) events_.push(now_ + o_.sample_interval_ns, EventKind::kSample, 0);
          break;
      }
      if (at_head) head_free_ = now_;  // charge() moved it on by the event's cost
      if (e.kind != EventKind::kSample) --pending_work_events_;
      if (o_.progress && (result_.events & 0xffff) == 0) o_.progress(finished_, total);
    }
    if (checker_) tables_refused_ = !checker_->finish();
    if (o_.sample_interval_ns > 0 && (result_.series.empty() || result_.series.back().t_ns < now_)) sample();
    for (SeriesPoint& p : result_.series) p.workers.resize(workers_.size());  // zero before a worker joined
    if (o_.progress) o_.progress(finished_, total);
    result_.end_ns = now_;
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
  void push_work(int64_t time, EventKind kind, uint64_t target) {
    events_.push(time, kind, target);
    ++pending_work_events_;
  }
  bool only_samples_left() const { return pending_work_events_ == 0; }

  // The head spends `cpu_ns` of its CPU on the event it is handling: what it
  // does after happens that much later (SimOptions::head).
  void charge(double cpu_ns) {
    const int64_t d = o_.head.service_ns(cpu_ns);
    now_ += d;
    result_.head_busy_ns += d;
  }

  void arrival(size_t i) {
    client_clock_ = event_time_;  // the client sends it now, whether or not the head is free
    client_queue_.push_back(i);
    if (o_.max_concurrency > 0 && outstanding_ >= o_.max_concurrency) return;
    head_changed();
  }

  // Sends held-back requests while the concurrency limit allows.
  bool release_clients() {
    bool sent = false;
    while (!client_queue_.empty() && (o_.max_concurrency == 0 || outstanding_ < o_.max_concurrency)) {
      const size_t i = client_queue_.front();
      client_queue_.pop_front();
      send(i);
      sent = true;
    }
    return sent;
  }

  void send(size_t i) {
    WorkloadRequest w = workload_[i];
    if (static_cast<int64_t>(w.input_len) + w.output_len > max_model_len_ &&
        o_.overlong == OverlongPolicy::kClip) {
      w.output_len = std::min(w.output_len, max_model_len_ - 1);
      w.input_len = std::max(1, std::min(w.input_len, max_model_len_ - w.output_len));
      ++result_.clipped;
    }
    core::Request r;
    r.id = i + 1;
    r.prompt_ids = build_prompt(w, i, o_.prompts);
    r.max_tokens = w.output_len;
    r.ignore_eos = true;
    r.sampling.temperature = 0;  // greedy, as the cost profile measured
    r.seed = i;
    core::RequestTiming& t = result_.requests[i];
    t.start_ns = head_costs_ ? client_clock_ : now_;
    t.prompt_tokens = w.input_len;
    t.token_ns.reserve(static_cast<size_t>(w.output_len));  // one allocation of its final size
    ++outstanding_;
    state_[i] = 1;
    if (head_costs_) charge(o_.head.request_ns);
    if (auto err = batcher_.submit(std::move(r), now_)) {
      t.success = false;
      t.error = *err;
      t.end_ns = now_;
      done(i);
      return;
    }
    touched_.push_back(batcher_.worker_of(i + 1));
  }

  void done(size_t i) {
    client_clock_ = now_;  // the client hears of it now, and may send the next
    state_[i] = 2;
    --outstanding_;
    ++finished_;
    ++finished_in_interval_;
  }

  // Something changed at the head: send what clients may send, plan for the
  // workers whose state changed, record what happened; again while finished
  // requests free clients.
  void head_changed() {
    release_clients();
    do {
      std::vector<uint64_t>& ids = planning_;  // touched_'s ids; touched_ collects the next ones
      ids.swap(touched_);
      touched_.clear();
      if (o_.schedule_all_workers || ids.empty()) ids.assign(1, 0);  // 0: requests waiting for a worker only
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      for (uint64_t id : ids) {
        if (id != 0 && !batcher_.has_worker(id)) continue;  // gone since it was touched
        if (o_.schedule_all_workers)
          plans_ = batcher_.schedule(now_);
        else
          batcher_.schedule(now_, id, plans_);
        for (core::Dispatch& d : plans_) {
          Worker& w = workers_[d.worker - 1];
          if (o_.step_log) o_.step_log->planned(d.worker, d.plan);
          const int64_t arrive =
              w.down.send(w.departs(now_), metered(w) ? plan_wire_bytes(d.plan) : 0, w.spec->link);
          w.to_worker.push_back(std::move(d.plan));
          push_work(arrive, EventKind::kPlanArrive, d.worker - 1);
        }
      }
      drain_events();
    } while (release_clients());
    if (auto d = batcher_.next_deadline(); d && (!deadline_ || *d < *deadline_)) {
      deadline_ = std::max(*d, now_);  // the timer's time: the kDeadline event clears it
      push_work(*deadline_, EventKind::kDeadline, 0);
    }
  }

  void drain_events() {
    batcher_.take_events(events_buf_);
    for (core::RequestEvent& ev : events_buf_) {
      const size_t i = ev.request_id - 1;
      core::RequestTiming& t = result_.requests[i];
      switch (ev.kind) {
        case core::EventKind::kScheduled:
          if (result_.scheduled_ns[i] < 0) {
            result_.scheduled_ns[i] = now_;
            result_.cached_tokens[i] = ev.usage.cached_tokens;
            result_.worker[i] = batcher_.worker_of(ev.request_id);
          }
          break;
        case core::EventKind::kPromptLogprobs:  // the simulated workloads ask for none
          break;
        case core::EventKind::kToken:
          t.token_ns.push_back(now_);
          ++tokens_in_interval_;
          break;
        case core::EventKind::kFinished: {
          t.end_ns = now_;
          t.output_tokens = ev.usage.completion_tokens;
          t.success =
              ev.finish_reason == core::FinishReason::kLength || ev.finish_reason == core::FinishReason::kEos;
          if (!t.success) t.error = ev.error.empty() ? core::to_string(ev.finish_reason) : ev.error;
          done(i);
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
    touched_.push_back(id);
    head_changed();
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
      if (!w.gone) touched_.push_back(w.id);
  }

  void let_go(Worker& w) {
    w.gone = true;
    w.to_worker.clear();
    w.queue.clear();
    w.to_head.clear();
    w.busy_ns = w.busy_until(now_);
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
        w.dead_at = event_time_;
        push_work(event_time_ + o_.node_loss_ns, EventKind::kFault, result_.faults.size() + k);
      } else {
        watch(k);
      }
      return;
    }
    const core::BatcherCounters before = batcher_.counters();
    const std::vector<size_t> on = requests_on(w.id);
    if (f.fault.kind == FaultKind::kKill) {  // noticed at once (node_loss_ns 0)
      w.last_stats = batcher_.scheduler(w.id)->stats();
      batcher_.remove_worker(w.id, now_, core::WorkerExit::kLost);
      let_go(w);
      f.removed_ns = now_;
    } else {
      batcher_.drain_worker(w.id);
      w.drain_fault = static_cast<int64_t>(k);
    }
    record(f, before, on);
    leave_if_drained(w);
    touch_all();
    head_changed();
  }

  // A drained worker leaves (its node exits), as the real one does.
  void leave_if_drained(Worker& w) {
    if (w.drain_fault < 0 || w.gone || !batcher_.drained(w.id)) return;
    w.last_stats = batcher_.scheduler(w.id)->stats();
    batcher_.remove_worker(w.id, now_, core::WorkerExit::kDrained);
    let_go(w);
    result_.faults[static_cast<size_t>(w.drain_fault)].removed_ns = now_;
  }

  // The watchdog checks step deadlines while fault k may need it.
  void watch(size_t k) {
    watched_.push_back(k);
    if (!watchdog_on_) {
      watchdog_on_ = true;
      push_work(now_ + o_.watchdog_interval_ns, EventKind::kWatchdog, 0);
    }
  }
  bool watching(size_t k) const {
    const FaultReport& f = result_.faults[k];
    const Worker& w = workers_[f.fault.worker - 1];
    return !w.gone && (f.fault.kind == FaultKind::kHang || now_ < f.fault.at_ns + f.fault.duration_ns);
  }

  // The link to w goes down for the fault's duration. The head hears nothing
  // from the node meanwhile: past the liveness window it loses it
  // (node_lost), and the node, its head silent as long, starts over.
  void cut(size_t k, Worker& w) {
    const FaultReport& f = result_.faults[k];
    if (w.gone || w.dead || w.hung || event_time_ < w.cut_until) return;
    check_cuttable(*w.spec, w.id);
    w.cut_from = event_time_;
    w.cut_until = event_time_ + f.fault.duration_ns;
    const size_t nf = result_.faults.size();
    if (f.fault.duration_ns >= o_.node_loss_ns)
      push_work(event_time_ + o_.node_loss_ns, EventKind::kFault, nf + k);
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
    f.returned_ns = now_;
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
    push_work(now_ + 2 * w.spec->link.latency_ns, EventKind::kFault, 3 * result_.faults.size() + k);
  }
  // Fault k's worker, let go, is back under a new id (a cut's node, a hung one started over).
  void registers_again(size_t k) {
    FaultReport& f = result_.faults[k];
    f.returned_ns = now_;
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
    batcher_.remove_worker(w.id, now_, core::WorkerExit::kLost);
    let_go(w);
    f.removed_ns = now_;
    record(f, before, on);
    touch_all();
    head_changed();
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
    const std::vector<core::HungWorker> hung = batcher_.take_hung(now_);
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
        f.removed_ns = now_;
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
    if (watchdog_on_) push_work(now_ + o_.watchdog_interval_ns, EventKind::kWatchdog, 0);
    if (!hung.empty()) {
      touch_all();
      head_changed();
    }
  }

  void plan_arrives(Worker& w) {
    if (w.gone) return;
    w.queue.push_back(std::move(w.to_worker.front()));
    w.to_worker.pop_front();
    if (!w.busy && !w.dead) start(w);
  }

  void start(Worker& w) {
    w.current = std::move(w.queue.front());
    w.queue.pop_front();
    // What runs: the plan as the worker's SequenceTable resolves it (items it
    // refuses do not run), or, without tables, the plan's work as it stands.
    w.items.clear();
    w.current_step = w.current.step_id;
    if (o_.worker_tables && !checker_) {
      w.table.prepare(w.current, w.prepared);
      for (const core::SeqChunk& c : w.prepared.chunks)
        w.items.push_back({c.seq_id, c.start_pos, static_cast<int32_t>(c.token_ids.size()), c.sample});
    } else {
      for (const core::SeqWork& x : w.current.work)
        w.items.push_back({x.seq_id, x.start_pos, x.num_tokens, x.sample});
      if (checker_) checker_->submit(w.id - 1, w.current);
    }
    w.busy = true;
    w.started = now_;
    StepShape shape;
    for (const Item& i : w.items) shape.add(i.start, i.n, i.sample);
    push_work(now_ + std::max<int64_t>(1, w.spec->cost->predict_ns(shape)), EventKind::kStepDone, w.id - 1);
  }

  void step_done(Worker& w) {
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
    if (o_.worker_tables && !checker_) {
      w.refused += static_cast<int64_t>(w.prepared.failures.size());
      r.failures = std::move(w.prepared.failures);
      w.table.commit(w.prepared, r.outputs, {});
    }
    r.forward_ms = static_cast<double>(now_ - w.started) / 1e6;
    w.busy_ns += now_ - w.started;
    w.busy = false;
    ++w.steps;
    const int64_t arrive = w.up.send(w.departs(now_), metered(w) ? result_wire_bytes(r) : 0, w.spec->link);
    w.to_head.push_back(std::move(r));
    push_work(arrive, EventKind::kResultArrive, w.id - 1);
    if (!w.queue.empty()) start(w);
  }

  void result_arrives(Worker& w) {
    if (w.gone) return;  // sent before it went; the head drops it
    core::StepResult r = std::move(w.to_head.front());
    w.to_head.pop_front();
    if (head_costs_)
      charge(o_.head.step_ns + o_.head.token_ns * static_cast<double>(r.outputs.size()));
    if (o_.step_log) o_.step_log->done(w.id, r);
    if (auto err = batcher_.on_result(w.id, r, now_)) throw std::logic_error("simulation: " + *err);
    w.spare_outputs = std::move(r.outputs);
    touched_.push_back(w.id);
    leave_if_drained(w);
    head_changed();
  }

  void sample() {
    SeriesPoint p;
    p.t_ns = now_;
    p.waiting = batcher_.num_waiting();
    p.running = batcher_.num_running();
    p.client_queue = static_cast<int32_t>(client_queue_.size());
    p.output_tokens = tokens_in_interval_;
    p.finished = finished_in_interval_;
    tokens_in_interval_ = 0;
    finished_in_interval_ = 0;
    const int64_t span = result_.series.empty() ? now_ : now_ - result_.series.back().t_ns;
    if (span > 0)
      p.head_busy = static_cast<double>(result_.head_busy_ns - head_busy_at_sample_) / static_cast<double>(span);
    head_busy_at_sample_ = result_.head_busy_ns;
    for (Worker& w : workers_) {
      SeriesPoint::Worker x;
      const int64_t busy = w.busy_until(now_);
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
  int64_t now_ = 0;         // the time of the event being handled; the head's, past its queue
  int64_t event_time_ = 0;  // that event's own time
  bool head_costs_ = false;     // SimOptions::head is not free
  int64_t head_free_ = 0;       // when the head is done with the events it has taken
  int64_t client_clock_ = 0;    // when clients last acted (sent, or heard a request end)
  int64_t head_busy_at_sample_ = 0;
  int32_t max_model_len_ = 0;
  int64_t finished_ = 0;
  int32_t outstanding_ = 0;
  std::deque<size_t> client_queue_;
  std::vector<core::RequestEvent> events_buf_;  // drain_events()'s, reused
  std::vector<uint64_t> touched_;               // workers whose state changed since they were last planned
  std::vector<uint64_t> planning_;              // head_changed()'s: the touched workers it plans for
  std::vector<core::Dispatch> plans_;           // head_changed()'s, reused
  std::optional<int64_t> deadline_;
  int64_t pending_work_events_ = 0;
  int64_t tokens_in_interval_ = 0;
  int32_t finished_in_interval_ = 0;
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
