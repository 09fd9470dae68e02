#pragma once
// The head's side of the workers: the gateway actor owns every worker the
// batcher drives. Local workers (threads of the head) it spawns, joins and
// restarts; worker nodes register, heartbeat, receive plans and send results
// on the backend socket, and each of their workers is, to the batcher, a
// worker_actor handle to the gateway itself (plans come with the worker's
// id): the batcher cannot tell them from the local ones. The gateway keeps
// the Membership core and each remote worker's step stream whole across
// lost frames (transport/step_link.hpp).
//
//   node ──frames──▶ backend SocketLoop thread ──(frame, peer, Message)──▶ gateway ──(wjoin|wlost|wdrain|
//   result)──▶ batcher batcher ──(plan, worker id)──▶ gateway ──Plan frame──▶ node
//   batcher ──(wleft: drained|hung|broken)──▶ gateway: stop, restart (local) or reset/shutdown (node)
//
// A worker the batcher found hung (a step past its deadline) is fenced there
// (its late results are dropped); the gateway then restarts a local one
// under a new id (at most max_restarts times per local worker) and tells a
// node `reset`: it starts over with fresh workers and registers as new.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/batcher_actor.hpp"
#include "actors/worker_actor.hpp"
#include "caf/all.hpp"
#include "cluster/membership.hpp"
#include "core/scheduler.hpp"
#include "transport/arrival_clock.hpp"
#include "transport/socket_loop.hpp"

namespace troupe::cluster {

using frame_atom = caf::atom_constant<caf::atom("frame")>;  // (peer, Message) from the loop thread
// (reason) from the loop thread: a CurveZMQ handshake with the head failed.
using handshake_atom = caf::atom_constant<caf::atom("handshake")>;

// A worker of the head's own process.
struct LocalWorker {
  std::string device;           // "cpu", "cuda:0"
  actors::WorkerParams params;  // how to build it (again, on a restart)
  std::string cost;             // its step-cost model (a cost model's JSON), "" = fitted from its steps
};

struct GatewayConfig {
  transport::SocketLoop* loop = nullptr;  // the backend's; must outlive the gateway
  transport::SocketId backend = 0;
  // Stamped by the backend loop's thread as frames arrive (liveness); may be null.
  std::shared_ptr<transport::ArrivalClock> arrivals;
  core::SchedulerOptions
      worker_template;  // budgets for every worker; pool and model facts come from each node
  MembershipOptions membership;
  std::vector<LocalWorker> local;  // ids 1..n; remote workers get the ids after
  int32_t max_restarts = 3;        // per local worker: restarts after it hung or broke, then it is dropped
  std::chrono::milliseconds tick{200};  // how often heartbeats, resends and silence are checked
  // Log lines (the head's); empty = the loop's log.
  std::function<void(const std::string&)> log;
};

// Spawns the gateway; it spawns the local workers and ticks until it is sent an exit.
caf::actor spawn_gateway(caf::actor_system& system, GatewayConfig config, actors::batcher_actor batcher);

}  // namespace troupe::cluster

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::transport::Message)
