#pragma once
// The batcher actor: the shell around core::Batcher. It places requests on
// workers and drives every worker on its own: whenever a result comes back,
// that worker's next step is planned at once (with two steps in flight, the
// worker always has one queued). Local workers and remote ones (a proxy actor
// in front of a node's gateway) look the same here: a worker_actor handle.
//
//   router ──(run | end)──▶ batcher ──(plan, worker id, StepPlan)──▶ worker
//   router ◀──(events)──── batcher ◀──(result, worker id, StepResult)── worker
//   membership ──(wjoin | wlost | wdrain)──▶ batcher ──(wleft, worker id, WorkerExit, detail)──▶ membership:
//   a worker it let go (drained, hung past a step deadline, broken result); the batcher never stops a
//   worker actor itself, its owner (the gateway) does, restarts it or resets its node
//
// After an event that touched one worker only that worker is planned (and any
// that takes a waiting request); a watchdog checks the step deadlines every
// 250 ms (core::Batcher::take_hung).
#include <memory>

#include "actors/messages.hpp"
#include "actors/router_actor.hpp"
#include "actors/worker_actor.hpp"
#include "core/batcher.hpp"
#include "core/step_log.hpp"

namespace troupe::actors {

using batcher_actor =
    caf::typed_actor<caf::reacts_to<listen_atom, router_actor, caf::actor>,  // where events go, who hears of
                                                                             // drained workers
                     caf::reacts_to<run_atom, core::Request>, caf::reacts_to<end_atom, uint64_t, int32_t>,
                     caf::reacts_to<result_atom, uint64_t, core::StepResult>,
                     caf::replies_to<wjoin_atom, core::WorkerSpec, worker_actor>::with<std::string>,
                     caf::reacts_to<wlost_atom, uint64_t>, caf::reacts_to<wdrain_atom, uint64_t>,
                     caf::replies_to<stats_atom>::with<BatcherStatus>, caf::reacts_to<tick_atom>,
                     caf::reacts_to<watch_atom>>;

// step_log (optional): every step a worker runs, written as its result
// comes back (core/step_log.hpp).
batcher_actor spawn_batcher(caf::actor_system& system, const core::BatcherOptions& options,
                            std::shared_ptr<core::StepLog> step_log = nullptr);

router_actor spawn_router(caf::actor_system& system, const model::Tokenizer& tokenizer,
                          const RouterOptions& options, batcher_actor batcher, ClientSink sink);

}  // namespace troupe::actors
