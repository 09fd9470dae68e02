#include "cluster/gateway.hpp"

#include <map>
#include <memory>

namespace troupe::cluster {
namespace {

using actors::worker_actor;

// A remote worker as the batcher sees it: plans go out as frames.
struct ProxyState {
  transport::SocketLoop* loop = nullptr;
  transport::SocketId backend = 0;
  std::string peer;
  uint32_t index = 0;
  static inline const char* name = "worker-proxy";
};

worker_actor::behavior_type proxy(worker_actor::stateful_pointer<ProxyState> self,
                                  transport::SocketLoop* loop, transport::SocketId backend, std::string peer,
                                  uint32_t index) {
  self->state = ProxyState{loop, backend, std::move(peer), index};
  return {
      [=](actors::plan_atom, uint64_t, core::StepPlan& plan) {
        auto& st = self->state;
        st.loop->send_message(st.backend, st.peer, transport::Plan{st.index, std::move(plan)});
      },
  };
}

struct GatewayState {
  GatewayConfig config;
  std::unique_ptr<Membership> members;
  actors::batcher_actor batcher;
  // By worker id; shared with the exit hook that stops them with the gateway.
  std::shared_ptr<std::map<uint64_t, worker_actor>> proxies =
      std::make_shared<std::map<uint64_t, worker_actor>>();
  static inline const char* name = "gateway";
};

using Self = caf::stateful_actor<GatewayState>*;

void send(Self self, const std::string& peer, const transport::Message& m) {
  auto& st = self->state;
  st.config.loop->send_message(st.config.backend, peer, m);
  st.members->on_sent(peer, transport::Clock::now());
}

void drop_proxy(Self self, uint64_t worker_id) {
  auto& st = self->state;
  if (auto it = st.proxies->find(worker_id); it != st.proxies->end()) {
    caf::anon_send_exit(it->second, caf::exit_reason::user_shutdown);
    st.proxies->erase(it);
  }
}

void lose(Self self, uint64_t worker_id) {
  drop_proxy(self, worker_id);
  self->send(self->state.batcher, actors::wlost_atom::value, worker_id);
}

void on_register(Self self, const std::string& peer, const transport::Register& reg) {
  auto& st = self->state;
  auto outcome = st.members->on_register(peer, reg, transport::Clock::now());
  if (auto* refused = std::get_if<transport::Refused>(&outcome)) {
    st.config.loop->log("gateway: refused node '" + reg.node + "': " + refused->reason);
    st.config.loop->send_message(st.config.backend, peer, *refused);
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
    auto handle = self->spawn(proxy, st.config.loop, st.config.backend, peer, w.info.index);
    st.proxies->emplace(w.worker_id, handle);
    const uint64_t id = w.worker_id;
    self->request(st.batcher, std::chrono::seconds(10), actors::wjoin_atom::value, spec, handle)
        .then(
            [=](const std::string& err) {
              if (err.empty()) return;
              self->state.config.loop->log("gateway: worker " + std::to_string(id) + " not added: " + err);
              drop_proxy(self, id);
            },
            [=](caf::error&) { drop_proxy(self, id); });
  }
  st.config.loop->log("gateway: node '" + reg.node + "' joined with " +
                      std::to_string(joined.workers.size()) + " worker(s)");
  send(self, peer, joined.reply);
}

void on_frame(Self self, const std::string& peer, transport::Message& m) {
  auto& st = self->state;
  const auto now = transport::Clock::now();
  if (auto* reg = std::get_if<transport::Register>(&m)) return on_register(self, peer, *reg);
  if (!st.members->on_message(peer, now)) {
    // Not (or no longer) a member: a lost node must register again.
    if (!std::holds_alternative<transport::Error>(m) && !std::holds_alternative<transport::Shutdown>(m)) {
      send(self, peer,
           transport::Error{transport::ErrorCode::kUnexpected, "not a member: register first", {}});
    }
    return;
  }
  if (auto* res = std::get_if<transport::Result>(&m)) {
    if (auto id = st.members->worker_id(peer, res->worker)) {
      self->send(st.batcher, actors::result_atom::value, *id, std::move(res->result));
    }
  } else if (std::holds_alternative<transport::Drain>(m)) {
    for (uint64_t id : st.members->drain(peer)) self->send(st.batcher, actors::wdrain_atom::value, id);
  } else if (std::holds_alternative<transport::Shutdown>(m)) {
    // The node is gone on purpose: what it held moves elsewhere.
    for (uint64_t id : st.members->drain(peer)) {
      st.members->forget_worker(id);
      lose(self, id);
    }
  } else if (!std::holds_alternative<transport::Heartbeat>(m) &&
             !std::holds_alternative<transport::Error>(m)) {
    send(self, peer,
         transport::Error{transport::ErrorCode::kUnexpected,
                          std::string("the head's backend does not take '") + transport::type_name(m) + "'",
                          {}});
  }
}

caf::behavior gateway(Self self, GatewayConfig config, actors::batcher_actor batcher) {
  auto& st = self->state;
  st.members = std::make_unique<Membership>(config.membership, config.first_worker_id);
  st.config = std::move(config);
  st.batcher = std::move(batcher);
  self->attach_functor([proxies = st.proxies] {  // the proxies leave with the gateway
    for (auto& [id, p] : *proxies) caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  });
  self->send(self, actors::tick_atom::value);
  return {
      [=](frame_atom, const std::string& peer, transport::Message& m) { on_frame(self, peer, m); },
      [=](actors::tick_atom) {
        auto& s = self->state;
        const auto now = transport::Clock::now();
        for (uint64_t id : s.members->take_lost(now)) {
          s.config.loop->log("gateway: worker " + std::to_string(id) + " lost (no heartbeat)");
          lose(self, id);
        }
        for (const std::string& peer : s.members->heartbeats_due(now)) {
          s.config.loop->send_message(s.config.backend, peer, transport::Heartbeat{});
        }
        self->delayed_send(self, s.config.tick, actors::tick_atom::value);
      },
      [=](actors::drained_atom, uint64_t id) {
        drop_proxy(self, id);
        if (auto peer = self->state.members->forget_worker(id)) send(self, *peer, transport::Shutdown{});
      },
      [=](actors::wlost_atom, uint64_t id, const std::string& why) {  // the batcher dropped a broken worker
        self->state.config.loop->log("gateway: worker " + std::to_string(id) +
                                     " dropped and told to shut down: " + why);
        drop_proxy(self, id);
        if (auto peer = self->state.members->forget_worker(id)) send(self, *peer, transport::Shutdown{});
      },
  };
}

}  // namespace

caf::actor spawn_gateway(caf::actor_system& system, GatewayConfig config, actors::batcher_actor batcher) {
  return system.spawn(gateway, std::move(config), std::move(batcher));
}

}  // namespace troupe::cluster
