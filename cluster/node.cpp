#include "cluster/node.hpp"

#include <unistd.h>

#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include "actors/worker_actor.hpp"
#include "cluster/control_plane.hpp"
#include "cluster/emulated_worker.hpp"
#include "cluster/gateway.hpp"
#include "cluster/model_worker.hpp"
#include "cluster/signals.hpp"
#include "cluster/sim/cost_profile.hpp"
#include "model/cpu_count.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/threading.hpp"
#include "transport/dispatch.hpp"

namespace troupe::cluster {
namespace {

using actors::result_sink_actor;
using actors::worker_actor;
using Clock = transport::Clock;

using node_actor = result_sink_actor::extend<caf::reacts_to<frame_atom, std::string, transport::Message>,
                                             caf::reacts_to<actors::tick_atom>,
                                             caf::reacts_to<actors::wdrain_atom, uint64_t>>;

enum class Phase { kRegistering, kMember, kDraining, kDone };

struct NodeState {
  transport::SocketLoop* loop = nullptr;
  transport::SocketId socket = 0;
  transport::Register reg;
  std::vector<actors::WorkerParams> factories;  // one per worker index
  std::shared_ptr<std::vector<worker_actor>> workers = std::make_shared<std::vector<worker_actor>>();
  uint32_t generation = 0;  // results of an older generation of workers are dropped
  Phase phase = Phase::kRegistering;
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

void send(Self self, const transport::Message& m) {
  auto& st = self->state;
  st.loop->send_message(st.socket, {}, m);
  if (st.liveness) st.liveness->on_sent(Clock::now());
}

// Fresh workers: the head forgot this node's sequences, so do they.
void respawn(Self self) {
  auto& st = self->state;
  for (auto& w : *st.workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  st.workers->clear();
  ++st.generation;
  for (auto& params : st.factories) {
    st.workers->push_back(
        actors::spawn_worker(self->system(), params, caf::actor_cast<result_sink_actor>(self)));
  }
}

void register_now(Self self) {
  auto& st = self->state;
  send(self, st.reg);
  st.next_register = Clock::now() + st.backoff.next();
}

void head_lost(Self self, const std::string& why) {
  auto& st = self->state;
  st.loop->log("node: " + why + "; registering again with fresh workers");
  st.liveness.reset();
  st.phase = Phase::kRegistering;
  respawn(self);
  st.loop->reconnect(st.socket);
  st.next_register = Clock::now();  // at the next tick
}

void on_frame(Self self, transport::Message& m) {
  auto& st = self->state;
  const auto now = Clock::now();
  if (st.liveness) st.liveness->on_message(now);
  if (auto* ok = std::get_if<transport::Registered>(&m)) {
    if (st.phase != Phase::kRegistering) return;
    st.phase = Phase::kMember;
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
    if (plan->worker >= st.workers->size()) {
      send(self, transport::Error{transport::ErrorCode::kBadField,
                                  "plan for worker index " + std::to_string(plan->worker) +
                                      "; this node has " + std::to_string(st.workers->size()),
                                  {}});
      return;
    }
    const uint64_t id = (static_cast<uint64_t>(st.generation) << 32) | plan->worker;
    self->send((*st.workers)[plan->worker], actors::plan_atom::value, id, std::move(plan->plan));
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

node_actor::behavior_type node(Self self, transport::SocketLoop* loop, transport::SocketId socket,
                               transport::Register reg, std::vector<actors::WorkerParams> factories,
                               std::shared_ptr<std::promise<int>> exit, std::chrono::seconds drain_timeout) {
  auto& st = self->state;
  st.loop = loop;
  st.socket = socket;
  st.reg = std::move(reg);
  st.factories = std::move(factories);
  st.exit = std::move(exit);
  self->attach_functor([workers = st.workers] {  // the workers leave with the node
    for (auto& w : *workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  });
  respawn(self);
  register_now(self);
  self->send(self, actors::tick_atom::value);
  return {
      [=](actors::result_atom, uint64_t id, core::StepResult& result) {
        auto& s = self->state;
        if ((id >> 32) != s.generation || s.phase == Phase::kRegistering)
          return;  // from workers since replaced
        send(self, transport::Result{static_cast<uint32_t>(id & 0xffffffffu), std::move(result)});
      },
      [=](frame_atom, const std::string&, transport::Message& m) { on_frame(self, m); },
      [=](actors::tick_atom) {
        auto& s = self->state;
        const auto now = Clock::now();
        if (s.phase == Phase::kDone) return;
        if (s.phase == Phase::kRegistering && now >= s.next_register) register_now(self);
        if (s.liveness && s.phase != Phase::kRegistering) {
          if (s.liveness->lost(now)) {
            if (s.phase == Phase::kDraining) return finish(self, 0);  // nobody to hand back to
            head_lost(self,
                      "no word from the head for " + std::to_string(s.liveness->missed(now)) + " heartbeats");
          } else if (s.liveness->due_heartbeat(now)) {
            send(self, transport::Heartbeat{});
          }
        }
        if (s.phase == Phase::kDraining && now >= s.drain_deadline) {
          s.loop->log("node: drain timeout; leaving");
          send(self, transport::Shutdown{});
          return finish(self, 0);
        }
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

}  // namespace

int run_node(const NodeOptions& o) {
  SignalWaiter signals;  // before any thread starts
  model::ModelDir dir = model::load_model_dir(o.model_dir);
  const model::Gpt2Config& cfg = dir.config;
  const int32_t blocks =
      o.num_blocks > 0 ? o.num_blocks : blocks_for_kv_memory(cfg, o.kv_memory, o.block_size);
  const uint64_t fingerprint = model::fingerprint(cfg, dir.weights);
  std::vector<std::string> devices = o.devices;
  if (devices.size() == 1 && devices[0] == "cpu") devices.assign(static_cast<size_t>(o.workers), "cpu");
  if (devices.empty()) throw std::invalid_argument("a worker node needs at least one worker");

  transport::Register reg;
  reg.node = o.name.empty() ? default_name() : o.name;
  std::vector<actors::WorkerParams> factories;
  const auto budgets =
      model::split_thread_budget(model::usable_cpus(), static_cast<int>(devices.size()), o.threads_per_worker);
  std::map<std::string, std::shared_ptr<const model::Gpt2>> models;
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
  for (size_t i = 0; i < devices.size(); ++i) {
    ModelWorkerConfig wc{nullptr, blocks, o.block_size, budgets[i]};
    if (profile) {
      EmulatedWorkerConfig ec{profile->cost, {blocks, o.block_size, cfg.n_positions, cfg.vocab_size},
                              cfg.eos_token_id, o.emulate_time_scale};
      factories.push_back(actors::WorkerParams{[ec] { return make_emulated_runner(ec); }, true});
    } else {
      auto& m = models[devices[i]];
      if (!m) m = std::make_shared<model::Gpt2>(cfg, dir.weights, c10::Device(devices[i]));
      wc.model = m;
      factories.push_back(actors::WorkerParams{[wc] { return make_model_runner(wc); }, true});
    }
    transport::WorkerInfo info;
    info.index = static_cast<uint32_t>(i);
    info.device = profile ? "emulated" : devices[i];
    info.num_blocks = blocks;
    info.block_size = o.block_size;
    info.max_model_len = cfg.n_positions;
    info.vocab_size = cfg.vocab_size;
    info.threads = profile ? 0 : wc.threads.intra_op_threads;
    info.fingerprint = fingerprint;
    reg.workers.push_back(info);
  }
  model::release_weights(dir);

  caf::actor_system_config caf_cfg;
  configure_control_plane(caf_cfg, 1);
  caf::actor_system sys{caf_cfg};
  transport::SocketLoop loop(loop_options(o.max_frame_bytes, o.quiet));
  transport::SocketOptions so;
  so.role = transport::SocketOptions::Role::kClient;
  so.endpoint = o.join;
  so.name = "head";
  so.curve_client = o.curve;
  const transport::SocketId socket = loop.add_socket(so);

  auto exit = std::make_shared<std::promise<int>>();
  std::future<int> exited = exit->get_future();
  auto gw = sys.spawn(node, &loop, socket, reg, factories, exit, o.drain_timeout);
  loop.on_frame(transport::decode_frames(
      loop, [gw](transport::SocketId, const std::string& peer, transport::Message&& m) {
        caf::anon_send(gw, frame_atom::value, peer, std::move(m));
      }));
  loop.start();
  if (!o.quiet) {
    std::cerr << "troupe worker: node '" << reg.node << "' with " << devices.size() << " worker(s), "
              << blocks << " KV blocks each, joining " << o.join << std::endl;
  }
  int status = 0;
  bool draining = false;
  for (;;) {
    if (exited.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready) {
      status = exited.get();
      break;
    }
    if (signals.wait(std::chrono::milliseconds(200))) {
      if (draining) break;  // a second signal: leave now
      draining = true;
      caf::anon_send(gw, actors::wdrain_atom::value, uint64_t{0});
    }
  }
  // Tell the head we are gone (it moves what we held) unless it told us to go.
  loop.send_message(socket, {}, transport::Shutdown{});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the last frame leave (linger is 0)
  loop.stop();
  caf::anon_send_exit(gw, caf::exit_reason::user_shutdown);
  sys.await_all_actors_done();
  return status;
}

}  // namespace troupe::cluster
