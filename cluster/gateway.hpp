#pragma once
// The head's side of the backend socket: worker nodes register, heartbeat,
// receive plans and send results here. The gateway actor keeps the
// Membership core, gives each remote worker a proxy actor (a worker_actor
// like the local ones: the batcher cannot tell them apart) and tells the
// batcher who joined, who was lost and who drains.
//
//   node ──frames──▶ SocketLoop thread ──(frame, peer, Message)──▶ gateway ──(wjoin|wlost|wdrain|result)──▶
//   batcher batcher ──(plan)──▶ proxy ──Plan frame──▶ node        batcher ──(drained)──▶ gateway
//   ──Shutdown──▶ node
#include <cstdint>

#include "actors/batcher_actor.hpp"
#include "caf/all.hpp"
#include "cluster/membership.hpp"
#include "core/scheduler.hpp"
#include "transport/socket_loop.hpp"

namespace troupe::cluster {

using frame_atom = caf::atom_constant<caf::atom("frame")>;  // (peer, Message) from the loop thread

struct GatewayConfig {
  transport::SocketLoop* loop = nullptr;  // must outlive the gateway
  transport::SocketId backend = 0;
  core::SchedulerOptions
      worker_template;  // budgets for remote workers; pool and model facts come from each node
  MembershipOptions membership;
  uint64_t first_worker_id = 1;         // local workers take the ids below
  std::chrono::milliseconds tick{200};  // how often heartbeats and silence are checked
};

// Spawns the gateway; it ticks until it is sent an exit.
caf::actor spawn_gateway(caf::actor_system& system, GatewayConfig config, actors::batcher_actor batcher);

}  // namespace troupe::cluster

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::transport::Message)
