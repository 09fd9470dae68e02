#pragma once
// Simulator: a discrete-event simulation of a troupe cluster in virtual time.
//
// What runs is the real core: one core::Batcher (placement, one Scheduler per
// worker with its KV block accounting, prefix cache and preemption) forms
// every step, exactly as the batcher actor does. What is modelled:
//
//   client ──arrival──▶ head: Batcher.submit ──schedule──▶ plan ──link──▶ worker
//                           ▲                                              │ queue (FIFO)
//                           │                                              ▼ cost model: predict(plan)
//                           └── Batcher.on_result ◀──link── result ◀── StepDone
//
// - A worker is a core::SequenceTable (it checks and resolves every plan as
//   a real worker does; optional, see SimOptions::worker_tables) in front of
//   a CostModel: a step takes predict_ns(plan), then returns one token per
//   sampling item. Tokens never
//   end a request early: requests use ignore_eos and max_tokens = the
//   workload's output length.
// - Each worker has up to max_steps_in_flight steps outstanding (2 by
//   default, as the real batcher keeps them): the next plan travels while the
//   current step runs.
// - Messages between the head and a remote worker take latency + bytes ÷
//   bandwidth, in order per direction (network.hpp; sizes are estimates).
// - Faults (SimOptions::faults) strike at fixed virtual times through the
//   batcher's own code: a killed worker stops at once and is removed when
//   the head notices its silence, node_loss_ns later (Batcher::remove_worker:
//   its requests move and are recomputed), a hung one stops answering until
//   the batcher's step deadline finds it out (Batcher::take_hung, checked
//   every watchdog_interval_ns as the batcher actor's timer does), a
//   drained one takes no new requests (Batcher::drain_worker). A worker
//   added joins the batcher (Batcher::add_worker) under the next id. A cut
//   link holds the messages sent while it is down (both ways, in order) and
//   delivers them when it is back; a cut of node_loss_ns or more loses the
//   worker at cut + node_loss_ns (as a kill), and its node registers again,
//   as a new worker, when the link is back. Step deadlines are checked while
//   a link is down, so a step held too long is found out as a hang is.
// - The head is instantaneous by default: planning costs no virtual time, and
//   tokens reach the client when their result reaches the head. With a head
//   cost (SimOptions::head, `troupe profile --head`) it is one server with a
//   queue: a request taken in and a step result applied (with its tokens
//   routed) each take their cost, in arrival order, and what the head does
//   (plans sent, tokens streamed, requests placed) happens when it is done.
//   Either way, after each event it plans the workers whose state changed
//   (Batcher::schedule(now, worker)).
// - Clients: each workload request is sent at its arrival time, or, with a
//   concurrency limit, when fewer than that many are outstanding (its
//   latencies count from the send, as vLLM's benchmark counts them).
//
// Deterministic: same workload and options => same result, bit for bit
// (event_queue.hpp states the tie-breaking; the schedulers' seeds and
// prefix-hash keys are fixed here).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cluster/sim/cost_model.hpp"
#include "cluster/sim/head_cost.hpp"
#include "cluster/sim/network.hpp"
#include "cluster/sim/prompt_builder.hpp"
#include "cluster/sim/workload.hpp"
#include "core/batcher.hpp"
#include "core/serving_metrics.hpp"
#include "core/step_log.hpp"

namespace troupe::cluster::sim {

struct SimWorkerSpec {
  std::string node;                       // the node it lives on (reports)
  std::string device;                     // what its cost model measured (reports)
  std::shared_ptr<const CostModel> cost;  // required
  core::SchedulerOptions scheduler;       // pool size, budgets, max_model_len, vocabulary
  NetworkLink link;                       // between the head and it
  // The KV blocks the worker's own table holds, when they differ from the
  // scheduler's num_blocks (a worker misconfigured against its head: its
  // table refuses the blocks it does not have); 0 = num_blocks. Tests.
  int32_t table_blocks = 0;
};

// What a scripted event (a fault, or a change of membership) does.
enum class FaultKind {
  kKill,   // its process is gone at that instant (SIGKILL): the head removes it when its heartbeats stop
  kHang,   // its steps stop finishing (a stuck device or worker thread; the process still answers
           // heartbeats): found out by the step deadline
  kDrain,  // it is drained (SIGTERM): the requests it has not started move, the rest finish there
  kAdd,    // a new worker registers (SimFault::add): it takes the next id
  kCut,    // the link between the head and the worker is down for duration_ns: messages wait;
           // past the liveness window the head loses it and the node registers again as a new worker
};
const char* to_string(FaultKind kind);  // "kill", "hang", "drain", "add", "cut"

struct SimFault {
  SimFault() = default;
  SimFault(FaultKind kind_, uint64_t worker_, int64_t at_ns_, int64_t duration_ns_ = 0,
           std::shared_ptr<const SimWorkerSpec> add_ = nullptr)
      : kind(kind_), worker(worker_), at_ns(at_ns_), duration_ns(duration_ns_), add(std::move(add_)) {}
  FaultKind kind = FaultKind::kKill;
  uint64_t worker = 0;      // the worker struck, >= 1 (a worker that joins later may be named); add: 0
  int64_t at_ns = 0;        // virtual time, >= 0
  int64_t duration_ns = 0;  // cut: how long the link is down, > 0; others 0
  std::shared_ptr<const SimWorkerSpec> add;  // add: the worker that joins; others null
};
// "ID@T": worker ID at T seconds of virtual time ("3@30", "3@1.5"); throws
// std::invalid_argument naming the text otherwise.
SimFault parse_fault(FaultKind kind, const std::string& text);

// A request longer than a worker's max_model_len: shortened (prompt first,
// keeping at least one token) or refused (it fails, as the real batcher refuses it).
enum class OverlongPolicy { kClip, kFail };

struct SimOptions {
  std::vector<SimWorkerSpec> workers;  // ids 1..N in this order; at least one
  core::BatcherOptions batcher;
  int32_t max_concurrency = 0;                 // requests outstanding at once at most; 0 = no limit
  int64_t sample_interval_ns = 1'000'000'000;  // time series step; 0 = no time series
  PromptOptions prompts;
  OverlongPolicy overlong = OverlongPolicy::kClip;
  uint64_t seed = 0;  // schedulers' seeds and prefix-hash keys
  // After each event, plan every worker (Batcher::schedule(now)) instead of
  // only those whose state changed: the same plans at O(workers) the cost (tests).
  bool schedule_all_workers = false;
  // Each worker checks and resolves its plans with a core::SequenceTable, as a
  // real worker does. false skips that (the plans are run as they stand):
  // the same result, faster, for long runs once the protocol is trusted.
  bool worker_tables = true;
  // With worker_tables: run the tables on a second thread (TableChecker)
  // while the simulation goes on with each plan as it stands; the same
  // result, since a run in which a table refuses an item is run again with
  // the tables in line. For hosts with a second CPU to give (troupe simulate
  // and bench_sim set it when they have one).
  bool tables_on_thread = false;
  // Run the workers' own events (steps, plans and results) on two threads
  // where the run allows it: no faults, no concurrency limit, a free head,
  // no step log (otherwise serial, as without). The same result, bit for
  // bit; the tables then run in line on both. For hosts with a second CPU
  // to give (troupe simulate and bench_sim set it when they have one).
  bool parallel = false;
  // Every step the workers run, written as its result reaches the head, in
  // `troupe serve --step-log`'s format (its `ms` the predicted time; idle_ms 0):
  // served and simulated steps side by side. Unset: none.
  std::shared_ptr<core::StepLog> step_log;
  // Faults and membership changes to play, in any order (run in time order,
  // ties in this order). A fault on a worker already gone, or not yet there,
  // does nothing; so does a cut on a worker killed, hung or already cut.
  std::vector<SimFault> faults;
  // How often the head checks step deadlines while a hung worker is not yet
  // found out or a link is down (the batcher actor's watchdog ticks at a
  // fraction of the floor).
  int64_t watchdog_interval_ns = 250'000'000;
  // How long after a kill the head notices the silence and removes the
  // worker: its --liveness missed heartbeats of --heartbeat-ms (3 x 1 s by
  // default). Until then plans still go to the dead worker. 0 = at once.
  int64_t node_loss_ns = 3'000'000'000;
  // The head's own cost per event (head_cost.hpp); free() = an instantaneous head.
  HeadCost head;
  // Called now and then (every 2^16 events) and at the end: requests finished, of total.
  std::function<void(int64_t finished, int64_t total)> progress;
};

struct WorkerReport {
  uint64_t id = 0;
  std::string node, device;
  int32_t num_blocks = 0;
  int64_t busy_ns = 0;  // computing steps
  int64_t steps = 0;
  int64_t tokens_run = 0;  // tokens in its steps (prefill + decode)
  int64_t tokens_generated = 0;
  int64_t preemptions = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int32_t peak_blocks_used = 0;  // over the time series samples
  double mean_kv_use = 0;        // blocks used / pool, averaged over the samples
  int64_t refused_items = 0;     // work items its SequenceTable refused (a protocol bug: expect 0)
};

// The cluster at one instant of the time series; per-interval counts cover
// (t - interval, t].
struct SeriesPoint {
  struct Worker {
    double busy = 0;  // fraction of the interval spent computing
    int32_t blocks_used = 0, running = 0, waiting = 0;
    int64_t preemptions = 0;  // so far
  };
  int64_t t_ns = 0;
  int32_t waiting = 0;  // queued in the head (unplaced + waiting in schedulers)
  int32_t running = 0;
  int32_t client_queue = 0;   // held back by the concurrency limit
  double head_busy = 0;       // fraction of the interval the head spent on events (SimOptions::head)
  int64_t output_tokens = 0;  // generated in the interval
  int32_t finished = 0;       // requests finished in the interval
  std::vector<Worker> workers;
};

// What one fault or membership change did.
struct FaultReport {
  SimFault fault;                 // add: its worker is the id the new worker got
  int64_t removed_ns = -1;        // when the head let the worker go (kill: at once; hang: its deadline); -1 = never
  int64_t returned_ns = -1;       // cut: when its link came back; hang: when its node registered again
                                  // (or its local worker restarted); -1 = not by the end, or neither
  uint64_t new_worker = 0;        // cut, hang: the id it registered under again once let go; 0 = none
  int32_t requests_moved = 0;     // its unfinished requests that moved to other workers
  int64_t tokens_recomputed = 0;  // their tokens whose KV was computed again elsewhere
};

struct SimResult {
  std::vector<core::RequestTiming> requests;  // one per workload request, in its order (id = index + 1)
  std::vector<int64_t> scheduled_ns;          // first admission to a step; -1 = never
  std::vector<int32_t> cached_tokens;         // prompt tokens served from the prefix cache
  std::vector<uint64_t> worker;               // worker first admitting it; 0 = none
  // Ids 1..N: the options' workers, then those that joined (an add, a node
  // back after a cut) in the order they joined; zero in the series before.
  std::vector<WorkerReport> workers;
  std::vector<SeriesPoint> series;
  int64_t sample_interval_ns = 0;
  int64_t end_ns = 0;   // the last request's end
  uint64_t events = 0;  // events processed
  int32_t clipped = 0;  // requests shortened to fit max_model_len
  std::vector<FaultReport> faults;  // one per SimOptions::faults entry, in time order
  // Per request: a fault moved it off its worker (its latencies are the
  // "affected" ones of the report). Empty without faults.
  std::vector<char> affected;
  // The head (SimOptions::head): time spent on events, and the longest an
  // event waited for it. 0 for an instantaneous head.
  int64_t head_busy_ns = 0;
  int64_t head_max_wait_ns = 0;
};

// Throws std::invalid_argument on bad options, std::logic_error if the
// cluster stops making progress with requests unfinished (a bug).
SimResult simulate(const std::vector<WorkloadRequest>& workload, const SimOptions& options);

// The run's duration for metrics: first send to last response (at least 1 ns).
double duration_s(const SimResult& result);

}  // namespace troupe::cluster::sim
