#include "cluster/gateway.hpp"

#include <map>
#include <memory>

#include "cluster/step_cost.hpp"
#include "core/failpoints.hpp"
#include "transport/step_link.hpp"

namespace troupe::cluster {
namespace {

using actors::worker_actor;
using transport::Clock;

// A remote worker's step stream (transport/step_link.hpp).
struct RemoteWorker {
  std::string peer;
  uint32_t index = 0;
  transport::Unacked plans;                      // sent, until their result comes
  transport::InOrder<core::StepResult> results;  // to the batcher in step order, each once
};

struct GatewayState {
  GatewayConfig config;
  std::unique_ptr<Membership> members;
  actors::batcher_actor batcher;
  // Local worker actors, by worker id; shared with the exit hook that stops
  // them with the gateway. (A remote worker's handle is the gateway itself:
  // the batcher's plans for it come here, with its id, to be numbered and sent.)
  std::shared_ptr<std::map<uint64_t, worker_actor>> actors =
      std::make_shared<std::map<uint64_t, worker_actor>>();
  std::map<uint64_t, RemoteWorker> remote;  // by worker id
  std::map<uint64_t, size_t> local;         // worker id -> its entry in config.local
  std::vector<int32_t> restarts;            // per entry of config.local
  static inline const char* name = "gateway";
};

using Self = caf::stateful_actor<GatewayState>*;

void log(Self self, const std::string& line) {
  auto& c = self->state.config;
  if (c.log)
    c.log(line);
  else
    c.loop->log("gateway: " + line);
}

// A frame the node may not get (a resend brings it back when it matters).
void send_body(Self self, const std::string& peer, std::string body) {
  auto& st = self->state;
  if (!st.config.loop->send(st.config.backend, peer, std::move(body)))
    log(self,
        "a frame for node '" + st.members->node_name(peer) + "' was not sent (the socket's queue is full)");
  st.members->on_sent(peer, Clock::now());
}

void send(Self self, const std::string& peer, const transport::Message& m) {
  send_body(self, peer, transport::encode(m));
}

// How long a frame may be missing before it is sent again: longer than one
// takes to arrive, shorter than a heartbeat interval.
Clock::duration resend_grace(const GatewayState& st) {
  return std::max<Clock::duration>(std::chrono::milliseconds(100),
                                   st.config.membership.liveness.heartbeat_interval / 4);
}

void stop_actor(Self self, uint64_t worker_id) {
  auto& actors = *self->state.actors;
  if (auto it = actors.find(worker_id); it != actors.end()) {
    caf::anon_send_exit(it->second, caf::exit_reason::user_shutdown);
    actors.erase(it);
  }
}

// Joins a worker to the batcher; a refusal is logged and the worker stopped.
void join(Self self, const core::WorkerSpec& spec, worker_actor handle) {
  auto& st = self->state;
  if (handle.address() != self->address()) st.actors->emplace(spec.id, handle);
  const uint64_t id = spec.id;
  self->request(st.batcher, std::chrono::seconds(30), actors::wjoin_atom::value, spec, handle)
      .then(
          [=](const std::string& err) {
            if (err.empty()) return;
            log(self, "worker " + std::to_string(id) + " not added: " + err);
            stop_actor(self, id);
            self->state.remote.erase(id);
          },
          [=](caf::error& e) {
            log(self, "worker " + std::to_string(id) + " not added: " + self->system().render(e));
            stop_actor(self, id);
            self->state.remote.erase(id);
          });
}

void spawn_local(Self self, size_t entry, uint64_t id) {
  auto& st = self->state;
  const LocalWorker& lw = st.config.local[entry];
  worker_actor w = actors::spawn_worker(self->system(), lw.params, st.batcher);
  st.local[id] = entry;
  join(self, core::WorkerSpec{id, "local", lw.device, st.config.worker_template, make_step_cost(lw.cost)}, w);
}

// A remote worker is gone from the batcher's view: its stream too.
void drop_remote(Self self, uint64_t worker_id) { self->state.remote.erase(worker_id); }

void lose(Self self, uint64_t worker_id) {
  drop_remote(self, worker_id);
  self->send(self->state.batcher, actors::wlost_atom::value, worker_id);
}

void on_register(Self self, const std::string& peer, const transport::Register& reg) {
  auto& st = self->state;
  auto outcome = st.members->on_register(peer, reg, Clock::now());
  if (auto* refused = std::get_if<Membership::Refusal>(&outcome)) {
    log(self, "refused node '" + reg.node + "': " + refused->detail);
    st.config.loop->send_message(st.config.backend, peer, refused->reply);
    return;
  }
  auto& joined = std::get<Membership::Joined>(outcome);
  if (joined.again) {  // a retransmission: the reply again, nothing else
    send(self, peer, joined.reply);
    return;
  }
  for (uint64_t old : joined.replaced) lose(self, old);
  for (const JoinedWorker& w : joined.workers) {
    core::WorkerSpec spec;
    spec.id = w.worker_id;
    spec.node = w.node;
    spec.device = w.info.device;
    spec.scheduler = st.config.worker_template;
    spec.scheduler.num_blocks = w.info.num_blocks;
    spec.scheduler.block_size = w.info.block_size;
    spec.scheduler.max_model_len = w.info.max_model_len;
    spec.scheduler.vocab_size = w.info.vocab_size;
    spec.scheduler.max_steps_in_flight = 2;
    try {
      spec.cost = make_step_cost(w.info.cost);
    } catch (const std::exception& e) {
      log(self, "worker " + std::to_string(w.worker_id) + ": its cost model is unusable (" + e.what() +
                    "); fitting one to its steps");
      spec.cost = make_step_cost("");
    }
    RemoteWorker& link = st.remote[w.worker_id];
    link.peer = peer;
    link.index = w.info.index;
    join(self, spec, caf::actor_cast<worker_actor>(self));
  }
  log(self, "node '" + reg.node + "' joined with " + std::to_string(joined.workers.size()) + " worker(s)");
  send(self, peer, joined.reply);
}

RemoteWorker* remote_worker(Self self, const std::string& peer, uint32_t index, uint64_t* id = nullptr) {
  auto& st = self->state;
  const auto wid = st.members->worker_id(peer, index);
  if (!wid) return nullptr;
  auto it = st.remote.find(*wid);
  if (it == st.remote.end()) return nullptr;
  if (id) *id = *wid;
  return &it->second;
}

void on_result(Self self, const std::string& peer, transport::Result& r) {
  uint64_t id = 0;
  RemoteWorker* w = remote_worker(self, peer, r.worker, &id);
  if (!w) return;
  const uint64_t step = r.result.step_id;
  for (core::StepResult& res : w->results.arrive(step, std::move(r.result))) {
    w->plans.acked(res.step_id);  // its result came: the plan arrived
    self->send(self->state.batcher, actors::result_atom::value, id, std::move(res));
  }
}

// A node says how far each worker's plans got: send again what it lacks.
void on_progress(Self self, const std::string& peer, const std::vector<transport::WorkerProgress>& progress) {
  const auto now = Clock::now();
  for (const transport::WorkerProgress& p : progress) {
    RemoteWorker* w = remote_worker(self, peer, p.index);
    if (!w) continue;
    for (std::string& body : w->plans.resend(p.plans_received, now, resend_grace(self->state)))
      send_body(self, peer, std::move(body));
  }
}

void on_frame(Self self, const std::string& peer, transport::Message& m) {
  auto& st = self->state;
  if (auto* reg = std::get_if<transport::Register>(&m)) return on_register(self, peer, *reg);
  if (!st.members->on_message(peer, Clock::now())) {
    // Not (or no longer) a member: a lost node must register again.
    if (!std::holds_alternative<transport::Error>(m) && !std::holds_alternative<transport::Shutdown>(m)) {
      send(self, peer,
           transport::Error{transport::ErrorCode::kUnexpected, "not a member: register first", {}});
    }
    return;
  }
  if (auto* res = std::get_if<transport::Result>(&m)) {
    on_result(self, peer, *res);
  } else if (auto* hb = std::get_if<transport::Heartbeat>(&m)) {
    on_progress(self, peer, hb->progress);
  } else if (std::holds_alternative<transport::Drain>(m)) {
    for (uint64_t id : st.members->drain(peer)) self->send(st.batcher, actors::wdrain_atom::value, id);
  } else if (std::holds_alternative<transport::Shutdown>(m)) {
    // The node is gone on purpose: what it held moves elsewhere.
    for (uint64_t id : st.members->drain(peer)) {
      st.members->forget_worker(id);
      lose(self, id);
    }
  } else if (!std::holds_alternative<transport::Error>(m)) {
    send(self, peer,
         transport::Error{transport::ErrorCode::kUnexpected,
                          std::string("the head's backend does not take '") + transport::type_name(m) + "'",
                          {}});
  }
}

void on_plan(Self self, uint64_t id, core::StepPlan& plan) {
  auto it = self->state.remote.find(id);
  if (it == self->state.remote.end()) return;  // the worker is gone
  RemoteWorker& w = it->second;
  const uint64_t step = plan.step_id;
  std::string body = transport::encode(transport::Plan{w.index, std::move(plan), w.results.delivered()});
  w.plans.sent(step, body, Clock::now());
  if (TROUPE_FAILPOINT("head.send_plan").action == fail::Action::kDrop)
    return;  // lost: resent on the node's word
  send_body(self, w.peer, std::move(body));
}

// The heartbeat a node is owed: the results the head holds from each of its workers.
transport::Heartbeat acks_for(Self self, const std::string& peer) {
  transport::Heartbeat hb;
  for (const auto& [id, w] : self->state.remote)
    if (w.peer == peer) hb.acks.push_back({w.index, w.results.delivered()});
  return hb;
}

void on_tick(Self self) {
  auto& st = self->state;
  const auto now = Clock::now();
  if (st.config.arrivals) {
    for (const auto& [peer, when] : st.config.arrivals->take()) st.members->on_message(peer, when);
  }
  for (uint64_t id : st.members->take_lost(now)) {
    log(self, "worker " + std::to_string(id) + " lost (no heartbeat)");
    lose(self, id);
  }
  for (const std::string& peer : st.members->heartbeats_due(now)) {
    st.config.loop->send_message(st.config.backend, peer, acks_for(self, peer));
  }
}

// The batcher let a worker go. A local one is stopped and, unless it drained
// or failed too often, started again under a new id; a node whose worker hung
// is reset (it starts over as a new node); one whose worker drained or broke
// loses that worker, and is told to shut down with its last.
void on_left(Self self, uint64_t id, core::WorkerExit why, const std::string& detail) {
  auto& st = self->state;
  const std::string what = "worker " + std::to_string(id) + " " + core::to_string(why) + ": " + detail;
  if (auto l = st.local.find(id); l != st.local.end()) {
    const size_t entry = l->second;
    st.local.erase(l);
    stop_actor(self, id);
    if (why == core::WorkerExit::kDrained) return;
    if (st.restarts[entry] >= st.config.max_restarts) {
      log(self, what + "; not restarted: it failed " + std::to_string(st.restarts[entry] + 1) + " times");
      return;
    }
    ++st.restarts[entry];
    const uint64_t again = st.members->take_worker_id();
    log(self, what + "; restarted as worker " + std::to_string(again));
    spawn_local(self, entry, again);
    return;
  }
  drop_remote(self, id);
  const auto address = st.members->address(id);
  if (!address) return;
  const std::string peer = address->first;
  const std::string node = st.members->node_name(peer);
  if (why == core::WorkerExit::kHung) {
    log(self, what + "; node '" + node + "' is reset: it starts over with fresh workers");
    for (uint64_t other : st.members->forget_node(peer))
      if (other != id) lose(self, other);
    send(self, peer, transport::Reset{what});
    return;
  }
  if (why == core::WorkerExit::kBroken) log(self, what + "; dropped, and its node told to shut down");
  if (auto last = st.members->forget_worker(id)) send(self, *last, transport::Shutdown{});
}

caf::behavior gateway(Self self, GatewayConfig config, actors::batcher_actor batcher) {
  auto& st = self->state;
  st.members = std::make_unique<Membership>(config.membership, config.local.size() + 1);
  st.config = std::move(config);
  st.batcher = std::move(batcher);
  st.restarts.assign(st.config.local.size(), 0);
  self->attach_functor([actors = st.actors] {  // the local workers leave with the gateway
    for (auto& [id, a] : *actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  });
  for (size_t i = 0; i < st.config.local.size(); ++i) spawn_local(self, i, i + 1);
  self->send(self, actors::tick_atom::value);
  return {
      [=](frame_atom, const std::string& peer, transport::Message& m) { on_frame(self, peer, m); },
      [=](actors::plan_atom, uint64_t id, core::StepPlan& plan) { on_plan(self, id, plan); },
      [=](actors::tick_atom) {
        on_tick(self);
        self->delayed_send(self, self->state.config.tick, actors::tick_atom::value);
      },
      [=](actors::wleft_atom, uint64_t id, int32_t why, const std::string& detail) {
        on_left(self, id, static_cast<core::WorkerExit>(why), detail);
      },
  };
}

}  // namespace

caf::actor spawn_gateway(caf::actor_system& system, GatewayConfig config, actors::batcher_actor batcher) {
  return system.spawn(gateway, std::move(config), std::move(batcher));
}

}  // namespace troupe::cluster
