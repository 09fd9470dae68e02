#pragma once
// The worker actor: owns one device's step runner (the model and its KV pool,
// an emulation, or a script) and executes step plans in arrival order, so
// the batcher can keep two plans in its mailbox (asynchronous scheduling).
// Spawned detached: a forward pass never runs on CAF's shared scheduler
// threads. It makes no decisions; a plan that fails comes back as a result
// with its failures (core/step_plan.hpp), never as a dead actor.
//
//   batcher ──(plan, worker id, StepPlan)──▶ worker ──(result, worker id, StepResult)──▶ sink
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "actors/messages.hpp"

namespace troupe::actors {

// Whoever takes results: the batcher, or a worker node's gateway.
using result_sink_actor = caf::typed_actor<caf::reacts_to<result_atom, uint64_t, core::StepResult>>;
using worker_actor = caf::typed_actor<caf::reacts_to<plan_atom, uint64_t, core::StepPlan>>;

// Runs one plan. It reports failures in the result; an exception becomes a
// failed step (result.error).
using StepRunner = std::function<core::StepResult(const core::StepPlan&)>;

// What the worker's own thread has done, readable from any thread: a node
// reports it in its heartbeats, so that a node whose actor ticks while the
// forward pass is stuck is seen for what it is.
struct WorkerProgress {
  std::atomic<uint64_t> steps_done{0};
  std::atomic<int64_t> step_started_ns{0};  // steady-clock ns when the step now running began; 0 = idle

  // How long the step now running has been running at `now_ns`; 0 = idle.
  int64_t running_ns(int64_t now_ns) const {
    const int64_t started = step_started_ns.load(std::memory_order_relaxed);
    return started == 0 ? 0 : now_ns - started;
  }
};

struct WorkerParams {
  // Builds the runner on the worker's own thread, before the first plan
  // (thread budget, KV pool). Must not be empty.
  std::function<StepRunner()> make_runner;
  bool detached = true;                                // false only in deterministic tests (test coordinator)
  std::shared_ptr<WorkerProgress> progress = nullptr;  // updated around each step when set
};

worker_actor spawn_worker(caf::actor_system& system, WorkerParams params, result_sink_actor sink);

}  // namespace troupe::actors
