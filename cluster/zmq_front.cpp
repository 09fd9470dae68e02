#include "cluster/zmq_front.hpp"

namespace troupe::cluster {

transport::StatusReply to_wire(const actors::StatusReport& r, int32_t max_queue) {
  transport::StatusReply s;
  for (const core::WorkerStats& w : r.batcher.workers) {
    transport::WorkerStatus ws;
    ws.id = static_cast<uint32_t>(w.id);
    ws.node = w.node;
    ws.device = w.device;
    ws.state = w.state == core::WorkerState::kActive ? "ready" : "draining";
    ws.kv_used = w.scheduler.blocks_used;
    ws.kv_total = w.scheduler.blocks_used + w.scheduler.blocks_free;
    ws.running = w.scheduler.num_running;
    ws.waiting = w.scheduler.num_waiting;
    ws.tokens_per_s = r.uptime_s > 0 ? static_cast<double>(w.tokens_generated) / r.uptime_s : 0.0;
    ws.tokens = static_cast<uint64_t>(w.tokens_generated);
    ws.steps = static_cast<uint64_t>(w.steps);
    ws.busy_s = w.busy_ms / 1e3;
    ws.idle_s = w.idle_ms / 1e3;
    s.workers.push_back(std::move(ws));
  }
  const core::BatcherCounters& c = r.batcher.counters;
  s.workers_lost = static_cast<uint64_t>(c.workers_lost);
  s.workers_hung = static_cast<uint64_t>(c.workers_hung);
  s.workers_broken = static_cast<uint64_t>(c.workers_broken);
  s.requests_moved = static_cast<uint64_t>(c.requests_moved);
  s.tokens_recomputed = static_cast<uint64_t>(c.tokens_recomputed);
  s.queue_depth = r.router.queued;
  s.max_queue = max_queue;
  s.requests_served = static_cast<uint64_t>(r.router.finished);
  s.requests_running = static_cast<uint64_t>(r.router.running + r.router.queued);
  s.requests_rejected = static_cast<uint64_t>(r.router.rejected);
  s.uptime_s = r.uptime_s;
  return s;
}

actors::ClientSink zmq_client_sink(transport::SocketLoop& loop, transport::SocketId frontend,
                                   int32_t max_queue, std::function<void(const actors::ClientId& client)> unsent) {
  return [&loop, frontend, max_queue, unsent = std::move(unsent)](const actors::Reply& reply) {
    const std::string& peer = reply.client.peer;
    const bool sent = std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, actors::StatusReport>) {
            return loop.send_message(frontend, peer, to_wire(m, max_queue));
          } else {
            return loop.send_message(frontend, peer, m);
          }
        },
        reply.message);
    if (!sent && unsent) unsent(reply.client);
  };
}

void forward_client_message(transport::SocketLoop& loop, transport::SocketId frontend,
                            const actors::router_actor& router, const std::string& peer,
                            transport::Message&& message) {
  const actors::ClientId client = actors::ClientId::zmq(peer);
  if (auto* s = std::get_if<transport::Submit>(&message)) {
    caf::anon_send(router, actors::submit_atom::value, client, std::move(*s));
  } else if (auto* c = std::get_if<transport::Cancel>(&message)) {
    caf::anon_send(router, actors::cancel_atom::value, client, c->tag);
  } else if (std::holds_alternative<transport::Status>(message)) {
    caf::anon_send(router, actors::status_atom::value, client);
  } else if (!std::holds_alternative<transport::Error>(message)) {
    loop.send_message(frontend, peer,
                      transport::Error{transport::ErrorCode::kUnexpected,
                                       std::string("the client socket does not take '") +
                                           transport::type_name(message) + "'",
                                       {}});
  }
}

}  // namespace troupe::cluster
