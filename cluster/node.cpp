#include "cluster/node.hpp"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <iostream>
#include <map>
#include <memory>

#include "actors/worker_actor.hpp"
#include "cluster/control_plane.hpp"
#include "cluster/sim/live/emulated_worker.hpp"
#include "cluster/gateway.hpp"
#include "cluster/model_worker.hpp"
#include "cluster/shutdown_guard.hpp"
#include "cluster/signals.hpp"
#include "cluster/sim/cost_profile.hpp"
#include "core/failpoints.hpp"
#include "model/cpu_count.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/threading.hpp"
#include "transport/dispatch.hpp"
#include "transport/step_link.hpp"

namespace troupe::cluster {
namespace {

using actors::result_sink_actor;
using actors::worker_actor;
using Clock = transport::Clock;

using node_actor = result_sink_actor::extend<caf::reacts_to<frame_atom, std::string, transport::Message>,
                                             caf::reacts_to<actors::tick_atom>,
                                             caf::reacts_to<actors::wdrain_atom, uint64_t>,
                                             caf::reacts_to<handshake_atom, std::string>>;

enum class Phase { kRegistering, kMember, kDraining, kDone };

// One worker of this node and its step stream with the head
// (transport/step_link.hpp): plans run once each in step order, results are
// kept until the head acknowledges them.
struct Slot {
  worker_actor actor;
  uint64_t handle = 0;  // what the worker actor tags its results with (NodeState::next_handle)
  std::shared_ptr<actors::WorkerProgress> progress = std::make_shared<actors::WorkerProgress>();
  transport::InOrder<core::StepPlan> plans;
  transport::Unacked results;
};

struct NodeState {
  transport::SocketLoop* loop = nullptr;
  transport::SocketId socket = 0;
  transport::Register reg;
  std::string join;                             // the head's endpoint (log lines)
  std::vector<actors::WorkerParams> factories;  // one per worker index
  std::vector<Slot> slots;                      // one per worker index, the current workers
  // The worker actors, shared with the exit hook that stops them with the node.
  std::shared_ptr<std::vector<worker_actor>> actors = std::make_shared<std::vector<worker_actor>>();
  // Each worker actor spawned gets a handle never given before; a result
  // whose handle no slot holds comes from a worker since replaced, and is dropped.
  uint64_t next_handle = 1;
  Phase phase = Phase::kRegistering;
  bool ever_member = false;
  Clock::time_point started = Clock::now();
  std::chrono::seconds join_timeout{0};
  std::optional<transport::Liveness> liveness;
  transport::Backoff backoff{transport::BackoffOptions{}};
  Clock::time_point next_register{};
  Clock::time_point drain_deadline{};
  std::shared_ptr<std::promise<int>> exit;
  static inline const char* name = "node";
};

using Self = node_actor::stateful_pointer<NodeState>;

void finish(Self self, int status) {
  auto& st = self->state;
  if (st.phase == Phase::kDone) return;
  st.phase = Phase::kDone;
  st.exit->set_value(status);
}

void send_body(Self self, std::string body) {
  auto& st = self->state;
  if (!st.loop->send(st.socket, {}, std::move(body)))
    st.loop->log("node: a frame for the head was not sent (the socket's queue is full)");
  if (st.liveness) st.liveness->on_sent(Clock::now());
}

void send(Self self, const transport::Message& m) { send_body(self, transport::encode(m)); }

Clock::duration resend_grace(const NodeState& st) {
  const auto interval = st.liveness ? st.liveness->options().heartbeat_interval : std::chrono::milliseconds(1000);
  return std::max<Clock::duration>(std::chrono::milliseconds(100), interval / 4);
}

// Fresh workers and streams: the head forgot this node's sequences, so do they.
void respawn(Self self) {
  auto& st = self->state;
  for (auto& w : *st.actors) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  st.actors->clear();
  st.slots.clear();
  for (auto params : st.factories) {
    Slot slot;
    slot.handle = st.next_handle++;
    params.progress = slot.progress;
    slot.actor = actors::spawn_worker(self->system(), params, caf::actor_cast<result_sink_actor>(self));
    st.actors->push_back(slot.actor);
    st.slots.push_back(std::move(slot));
  }
}

void register_now(Self self) {
  auto& st = self->state;
  const int attempt = st.backoff.attempts() + 1;
  const auto wait = st.backoff.next();
  if (attempt > 1) {  // each retry is said, as far apart as the backoff makes them
    st.loop->log("node: no answer from the head at " + st.join + " yet (attempt " + std::to_string(attempt) +
                 "); trying again, next in " + std::to_string(wait.count() / 1000) + " s");
  }
  send(self, st.reg);
  st.next_register = Clock::now() + wait;
}

void head_lost(Self self, const std::string& why) {
  auto& st = self->state;
  st.loop->log("node: " + why + "; registering again with fresh workers");
  st.liveness.reset();
  st.phase = Phase::kRegistering;
  respawn(self);
  st.loop->reconnect(st.socket);
  st.backoff.reset();
  st.next_register = Clock::now();  // at the next tick
}

transport::Heartbeat progress_report(Self self) {
  auto& st = self->state;
  transport::Heartbeat hb;
  const int64_t now_ns = Clock::now().time_since_epoch().count();
  for (size_t i = 0; i < st.slots.size(); ++i) {
    const Slot& s = st.slots[i];
    hb.progress.push_back({static_cast<uint32_t>(i), s.plans.delivered(), s.results.last_sent(),
                           s.progress->steps_done.load(std::memory_order_relaxed),
                           s.progress->running_ns(now_ns) / 1'000'000});
  }
  return hb;
}

void on_plan(Self self, transport::Plan& plan) {
  auto& st = self->state;
  if (plan.worker >= st.slots.size()) {
    send(self, transport::Error{transport::ErrorCode::kBadField,
                                "plan for worker index " + std::to_string(plan.worker) + "; this node has " +
                                    std::to_string(st.slots.size()),
                                {}});
    return;
  }
  if (TROUPE_FAILPOINT("node.recv_plan").action == fail::Action::kDrop) return;  // lost: the head resends it
  Slot& slot = st.slots[plan.worker];
  slot.results.acked(plan.ack);
  const uint64_t step = plan.plan.step_id;
  for (core::StepPlan& p : slot.plans.arrive(step, std::move(plan.plan)))
    self->send(slot.actor, actors::plan_atom::value, slot.handle, std::move(p));
}

// The head says which results it holds: send again what it lacks.
void on_acks(Self self, const std::vector<transport::WorkerAck>& acks) {
  auto& st = self->state;
  const auto now = Clock::now();
  for (const transport::WorkerAck& a : acks) {
    if (a.index >= st.slots.size()) continue;
    for (std::string& body : st.slots[a.index].results.resend(a.results_received, now, resend_grace(st)))
      send_body(self, std::move(body));
  }
}

void on_frame(Self self, transport::Message& m) {
  auto& st = self->state;
  const auto now = Clock::now();
  if (st.liveness) st.liveness->on_message(now);
  if (auto* ok = std::get_if<transport::Registered>(&m)) {
    if (st.phase != Phase::kRegistering) return;
    st.phase = Phase::kMember;
    st.ever_member = true;
    st.backoff.reset();
    st.liveness.emplace(transport::LivenessOptions{std::chrono::milliseconds(ok->heartbeat_ms), ok->liveness},
                        now);
    std::string ids;
    for (const auto& w : ok->workers) ids += (ids.empty() ? "" : ", ") + std::to_string(w.worker_id);
    st.loop->log("node: registered; worker ids " + ids);
  } else if (auto* no = std::get_if<transport::Refused>(&m)) {
    st.loop->log("node: the head refused this node: " + no->reason);
    finish(self, 1);
  } else if (auto* plan = std::get_if<transport::Plan>(&m)) {
    if (st.phase == Phase::kMember || st.phase == Phase::kDraining) on_plan(self, *plan);
  } else if (auto* hb = std::get_if<transport::Heartbeat>(&m)) {
    on_acks(self, hb->acks);
  } else if (auto* reset = std::get_if<transport::Reset>(&m)) {
    if (st.phase == Phase::kMember || st.phase == Phase::kDraining)
      head_lost(self, "the head reset this node (" + reset->reason + ")");
  } else if (std::holds_alternative<transport::Shutdown>(m)) {
    st.loop->log("node: the head says shutdown");
    finish(self, 0);
  } else if (auto* err = std::get_if<transport::Error>(&m)) {
    if (err->code == transport::ErrorCode::kUnexpected && st.phase == Phase::kMember) {
      head_lost(self, "the head does not know this node (" + err->message + ")");
    } else {
      st.loop->log("node: the head reports an error: " + err->message);
    }
  }
}

void on_tick(Self self) {
  auto& st = self->state;
  const auto now = Clock::now();
  if (st.phase == Phase::kRegistering) {
    if (!st.ever_member && st.join_timeout.count() > 0 && now - st.started >= st.join_timeout) {
      st.loop->log("node: no head answered at " + st.join + " within " + std::to_string(st.join_timeout.count()) +
                   " s (--join-timeout); giving up");
      return finish(self, 1);
    }
    if (now >= st.next_register) register_now(self);
  }
  if (st.liveness && st.phase != Phase::kRegistering) {
    if (st.liveness->lost(now)) {
      if (st.phase == Phase::kDraining) return finish(self, 0);  // nobody to hand back to
      return head_lost(self,
                       "no word from the head for " + std::to_string(st.liveness->missed(now)) + " heartbeats");
    }
    if (st.liveness->due_heartbeat(now)) {
      transport::Heartbeat hb = progress_report(self);
      if (TROUPE_FAILPOINT("node.heartbeat").action == fail::Action::kDrop)
        st.liveness->on_sent(now);
      else
        send(self, hb);
    }
  }
  if (st.phase == Phase::kDraining && now >= st.drain_deadline) {
    st.loop->log("node: drain timeout; leaving");
    send(self, transport::Shutdown{});
    finish(self, 0);
  }
}

node_actor::behavior_type node(Self self, transport::SocketLoop* loop, transport::SocketId socket,
                               NodeOptions options, transport::Register reg,
                               std::vector<actors::WorkerParams> factories, std::shared_ptr<std::promise<int>> exit) {
  auto& st = self->state;
  st.loop = loop;
  st.socket = socket;
  st.reg = std::move(reg);
  st.join = options.join;
  st.join_timeout = options.join_timeout;
  st.factories = std::move(factories);
  st.exit = std::move(exit);
  self->attach_functor([actors = st.actors] {  // the workers leave with the node
    for (auto& w : *actors) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  });
  respawn(self);
  register_now(self);
  self->send(self, actors::tick_atom::value);
  const auto drain_timeout = options.drain_timeout;
  return {
      [=](actors::result_atom, uint64_t handle, core::StepResult& result) {
        auto& s = self->state;
        const auto found =
            std::find_if(s.slots.begin(), s.slots.end(), [&](const Slot& x) { return x.handle == handle; });
        if (found == s.slots.end() || s.phase == Phase::kRegistering) return;  // from workers since replaced
        const auto index = static_cast<uint32_t>(found - s.slots.begin());
        const uint64_t step = result.step_id;
        std::string body = transport::encode(transport::Result{index, std::move(result)});
        s.slots[index].results.sent(step, body, Clock::now());
        if (TROUPE_FAILPOINT("node.send_result").action == fail::Action::kDrop) return;  // resent on the head's acks
        send_body(self, std::move(body));
      },
      [=](frame_atom, const std::string&, transport::Message& m) { on_frame(self, m); },
      [=](handshake_atom, const std::string& reason) {  // a certain failure, or three in a row
        auto& s = self->state;
        const std::string what = "the CurveZMQ handshake with the head at " + s.join + " failed: " + reason;
        if (s.ever_member) return s.loop->log("node: " + what);  // the head's keys changed? it retries
        s.loop->log("node: " + what + "; giving up");
        finish(self, 1);
      },
      [=](actors::tick_atom) {
        on_tick(self);
        if (self->state.phase != Phase::kDone)
          self->delayed_send(self, std::chrono::milliseconds(100), actors::tick_atom::value);
      },
      [=](actors::wdrain_atom, uint64_t) {
        auto& s = self->state;
        if (s.phase != Phase::kMember) return finish(self, 0);
        s.phase = Phase::kDraining;
        s.drain_deadline = Clock::now() + drain_timeout;
        s.loop->log("node: draining: the head moves queued work away and lets running work finish");
        send(self, transport::Drain{});
      },
  };
}

std::string default_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

// What a node brings: its workers' factories and how it describes them to
// the head (Register).
struct NodeWorkers {
  transport::Register reg;
  std::vector<actors::WorkerParams> factories;
  int32_t blocks = 0;
};

// The step-cost model the head's step deadlines use: the emulation's own, or
// a profile of this node's workers, or none (the head fits one).
std::string node_cost(const NodeOptions& o, const std::optional<sim::CostProfile>& emulated) {
  if (emulated) return emulated->cost.scaled(o.emulate_time_scale).to_json().dump();
  if (!o.cost_profile.empty()) return sim::read_cost_profile(o.cost_profile).cost.to_json().dump();
  return {};
}

// One worker per device: the model (shared per device:
// model::models_per_device) or, with --emulate, the cost profile's step times.
NodeWorkers node_workers(const NodeOptions& o, model::ModelDir& dir) {
  const model::Gpt2Config& cfg = dir.config;
  const std::vector<std::string> devices = worker_devices(o.devices, o.workers);
  if (devices.empty()) throw std::invalid_argument("a worker node needs at least one worker");
  NodeWorkers nw;
  const model::WeightDtype dtype = model::parse_weight_dtype(o.dtype);
  const model::KvDtype kv_dtype = model::parse_kv_cache_dtype(o.kv_cache_dtype, dtype);
  nw.blocks = o.num_blocks > 0 ? o.num_blocks : blocks_for_kv_memory(cfg, o.kv_memory, o.block_size, kv_dtype);
  nw.reg.node = o.name.empty() ? default_name() : o.name;
  std::optional<sim::CostProfile> profile;
  if (!o.emulate.empty()) {
    profile = sim::read_cost_profile(o.emulate);
    const auto& m = profile->model;
    if (!o.quiet && (m.n_layer != cfg.n_layer || m.n_embd != cfg.n_embd || m.vocab_size != cfg.vocab_size)) {
      std::cerr << "worker: note: the cost profile was measured on a " << m.n_layer << "-layer, " << m.n_embd
                << "-wide model; the emulated workers report this model (" << cfg.n_layer << " layers, "
                << cfg.n_embd << " wide) and take the profile's step times\n";
    }
  }
  const std::string cost = node_cost(o, profile);
  const uint64_t fingerprint = model::fingerprint(cfg, dir.weights);
  const auto budgets =
      model::split_thread_budget(model::usable_cpus(), static_cast<int>(devices.size()), o.threads_per_worker);
  const auto models = profile ? std::map<std::string, std::shared_ptr<const model::Gpt2>>{}
                              : model::models_per_device(dir, devices, dtype);
  for (size_t i = 0; i < devices.size(); ++i) {
    ModelWorkerConfig wc{nullptr, nw.blocks, o.block_size, budgets[i], kv_dtype};
    if (profile) {
      EmulatedWorkerConfig ec{profile->cost, {nw.blocks, o.block_size, cfg.n_positions, cfg.vocab_size},
                              cfg.eos_token_id, o.emulate_time_scale};
      nw.factories.push_back(actors::WorkerParams{[ec] { return make_emulated_runner(ec); }, true, nullptr});
    } else {
      wc.model = models.at(devices[i]);
      nw.factories.push_back(actors::WorkerParams{[wc] { return make_model_runner(wc); }, true, nullptr});
    }
    transport::WorkerInfo info;
    info.index = static_cast<uint32_t>(i);
    info.device = profile ? "emulated" : devices[i];
    info.num_blocks = nw.blocks;
    info.block_size = o.block_size;
    info.max_model_len = cfg.n_positions;
    info.vocab_size = cfg.vocab_size;
    info.threads = profile ? 0 : wc.threads.intra_op_threads;
    info.fingerprint = fingerprint;
    info.dtype = model::to_string(dtype);
    info.kv_dtype = model::to_string(kv_dtype);
    info.kv_bytes = model::PagedKvCache::bytes_per_block(cfg, o.block_size, kv_dtype) * nw.blocks;
    info.cost = cost;
    nw.reg.workers.push_back(info);
  }
  return nw;
}

// Until the node actor finishes (the head said shutdown, a drain ended, a
// handshake failed for good) or a second signal; the first signal drains.
int wait_for_node(SignalWaiter& signals, std::future<int>& exited, const caf::actor& node) {
  bool draining = false;
  for (;;) {
    if (exited.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready) return exited.get();
    if (signals.wait(std::chrono::milliseconds(200))) {
      if (draining) return 0;  // a second signal: leave now
      draining = true;
      caf::anon_send(node, actors::wdrain_atom::value, uint64_t{0});
    }
  }
}

}  // namespace

int run_node(const NodeOptions& o) {
  SignalWaiter signals;  // before any thread starts
  model::ModelDir dir = model::load_model_dir(o.model_dir);
  NodeWorkers workers = node_workers(o, dir);
  model::release_weights(dir);

  ControlPlaneSystem actors(1);
  transport::SocketLoop loop(loop_options(o.max_frame_bytes, o.quiet));
  const transport::SocketId socket = loop.add_socket(client_socket(o.join, "head", o.curve));
  auto exit = std::make_shared<std::promise<int>>();
  std::future<int> exited = exit->get_future();
  auto gw = caf::actor_cast<caf::actor>(
      actors.system->spawn(node, &loop, socket, o, workers.reg, std::move(workers.factories), exit));
  ShutdownGuard guard(*actors.system, {gw}, "troupe worker", o.quiet);
  frames_to(loop, gw);
  loop.on_socket_event(
      [gw, verdict = transport::HandshakeVerdict()](transport::SocketId, const transport::SocketEvent& e) mutable {
        if (verdict.give_up(e)) caf::anon_send(gw, handshake_atom::value, e.reason);
      });
  loop.start();
  if (!o.quiet) {
    std::cerr << "troupe worker: node '" << workers.reg.node << "' with " << workers.reg.workers.size()
              << " worker(s), " << workers.blocks << " KV blocks each, joining " << o.join << std::endl;
  }
  const int status = wait_for_node(signals, exited, gw);
  // Tell the head we are gone (it moves what we held) unless it told us to go.
  loop.send_message(socket, {}, transport::Shutdown{});
  loop.flush(std::chrono::milliseconds(500));  // the last frame leaves before the socket closes
  loop.stop();
  guard.stop(status);
  return status;
}

}  // namespace troupe::cluster
