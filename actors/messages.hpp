#pragma once
// The vocabulary of troupe's actors: every atom (one header, troupe's
// namespace, at most 10 characters each, CAF 0.17 style) and the local-only
// message types. Local-only types never cross a process: the wire is
// transport/'s msgpack schema, so they are whitelisted rather than made
// inspectable, and must never reach a CAF serializer.
#include <cstdint>
#include <string>
#include <vector>

#include "actors/router/router_core.hpp"
#include "caf/all.hpp"
#include "core/batcher.hpp"
#include "core/request.hpp"
#include "core/step_plan.hpp"

namespace troupe::actors {

// Router (front door).
using submit_atom = caf::atom_constant<caf::atom("submit")>;      // (client, Job) from a front
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;      // (client, tag) from a front
using gone_atom = caf::atom_constant<caf::atom("gone")>;          // (client): it cannot be reached
using events_atom = caf::atom_constant<caf::atom("events")>;      // (RequestEvents) batcher -> router
using workers_atom = caf::atom_constant<caf::atom("workers")>;    // (n) batcher -> router
using status_atom = caf::atom_constant<caf::atom("status")>;      // (client) a status request
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;  // stop taking new work
using idle_atom = caf::atom_constant<caf::atom("idle")>;          // -> bool: nothing in flight
using abort_atom = caf::atom_constant<caf::atom("abort")>;        // (why) -> jobs ended with an error

// Batcher.
using run_atom = caf::atom_constant<caf::atom("run")>;        // (Request) router -> batcher
using end_atom = caf::atom_constant<caf::atom("end")>;        // (id, reason) router -> batcher
using result_atom = caf::atom_constant<caf::atom("result")>;  // (worker id, StepResult) worker -> batcher
using wjoin_atom = caf::atom_constant<caf::atom("wjoin")>;    // (WorkerSpec, worker) -> error text
using wlost_atom = caf::atom_constant<caf::atom("wlost")>;    // (worker id): its process or host is gone
using wdrain_atom = caf::atom_constant<caf::atom("wdrain")>;  // (worker id): hand back, then leave
// (worker id, core::WorkerExit as int32, detail) batcher -> membership: the
// batcher let the worker go (drained, hung, broken); its owner stops,
// restarts or resets it.
using wleft_atom = caf::atom_constant<caf::atom("wleft")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;    // the batcher's step-deadline watchdog timer
using stats_atom = caf::atom_constant<caf::atom("stats")>;    // -> BatcherStatus
using listen_atom = caf::atom_constant<caf::atom("listen")>;  // (router): where events go
using tick_atom = caf::atom_constant<caf::atom("tick")>;      // internal timer

// Worker.
using plan_atom = caf::atom_constant<caf::atom("plan")>;  // (worker id, StepPlan) batcher -> worker

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ClientId)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::Job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::BatcherStatus)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StatusReport)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::core::Request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::core::StepPlan)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::core::StepResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::core::WorkerSpec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<troupe::core::RequestEvent>)
