#include "cluster/head.hpp"

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>

#include "actors/batcher_actor.hpp"
#include "actors/router_actor.hpp"
#include "actors/worker_actor.hpp"
#include "cluster/control_plane.hpp"
#include "cluster/gateway.hpp"
#include "cluster/http/http_front.hpp"
#include "cluster/http/metrics_collector.hpp"
#include "cluster/model_worker.hpp"
#include "cluster/shutdown_guard.hpp"
#include "cluster/signals.hpp"
#include "cluster/sim/cost_profile.hpp"
#include "cluster/zmq_front.hpp"
#include "core/failpoints.hpp"
#include "model/cpu_count.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/threading.hpp"
#include "transport/dispatch.hpp"

namespace troupe::cluster {
namespace {

void log_line(bool quiet, const std::string& line) {
  if (!quiet) std::cerr << "troupe serve: " + line + "\n" << std::flush;
}

// The local workers: one per device, or `workers` CPU workers sharing the
// usable CPUs.
std::vector<std::string> local_devices(const HeadOptions& o) {
  if (o.devices.size() == 1 && o.devices[0] == "cpu") return std::vector<std::string>(o.workers, "cpu");
  return o.devices;
}

// The model folder's own name ("models/gpt2/" -> "gpt2"), as vLLM names a
// model after its path by default.
std::string served_model_name(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

// Which of the head's own actors died, and why: the first one ends the head.
class Fatal {
 public:
  // Watches `actor`: an exit for any reason but a requested stop is fatal.
  void watch(caf::actor_system& sys, const caf::actor& actor, const std::string& name) {
    actor->attach_functor([this, &sys, name](const caf::error& reason) {
      if (!reason || reason == caf::exit_reason::user_shutdown) return;
      std::lock_guard<std::mutex> lock(mutex_);
      if (what_.empty()) what_ = "the " + name + " actor died (" + sys.render(reason) + ")";
      set_ = true;
    });
  }
  bool set() const { return set_; }
  std::string what() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return what_;
  }

 private:
  mutable std::mutex mutex_;
  std::string what_;
  std::atomic<bool> set_{false};
};

// The local workers the gateway spawns (and restarts): the weights shared per
// device, each with its own KV pool and threads.
std::vector<LocalWorker> local_workers(const HeadOptions& o, const model::ModelDir& dir,
                                       const core::SchedulerOptions& sched, const std::string& cost) {
  const std::vector<std::string> devices = local_devices(o);
  std::vector<LocalWorker> out;
  if (devices.empty()) return out;
  const auto budgets = model::split_thread_budget(model::usable_cpus(), static_cast<int>(devices.size()),
                                                  o.threads_per_worker);
  std::map<std::string, std::shared_ptr<const model::Gpt2>> models;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto& m = models[devices[i]];
    if (!m) m = std::make_shared<model::Gpt2>(dir.config, dir.weights, c10::Device(devices[i]));
    ModelWorkerConfig wc{m, sched.num_blocks, sched.block_size, budgets[i]};
    out.push_back(
        {devices[i], actors::WorkerParams{[wc] { return make_model_runner(wc); }, true, nullptr}, cost});
  }
  return out;
}

transport::SocketOptions server_socket(const std::string& endpoint, const std::string& name,
                                       const std::optional<transport::CurveServerKeys>& curve,
                                       bool insecure) {
  transport::SocketOptions s;
  s.role = transport::SocketOptions::Role::kServer;
  s.endpoint = endpoint;
  s.name = name;
  s.curve_server = curve;
  s.insecure = insecure;
  return s;
}

}  // namespace

int run_head(const HeadOptions& o) {
  SignalWaiter signals;  // before any thread starts
  model::ModelDir dir = model::load_model_dir(o.model_dir);
  const model::Gpt2Config& cfg = dir.config;
  core::SchedulerOptions sched = o.scheduler;
  sched.max_model_len = cfg.n_positions;
  sched.vocab_size = cfg.vocab_size;
  sched.eos_id = cfg.eos_token_id;
  sched.max_steps_in_flight = 2;
  sched.num_blocks =
      o.num_blocks > 0 ? o.num_blocks : blocks_for_kv_memory(cfg, o.kv_memory, sched.block_size);
  const uint64_t fingerprint = model::fingerprint(cfg, dir.weights);
  const std::string local_cost =
      o.cost_profile.empty() ? std::string() : sim::read_cost_profile(o.cost_profile).cost.to_json().dump();

  // Every reply is observed for /metrics, then goes to the front of its
  // client: "h..." the HTTP front, "z..." the ZeroMQ one. The HTTP address is
  // bound before any actor starts, so a taken port fails fast and cleanly.
  HttpOptions http_opts = o.http;
  if (http_opts.model_name.empty()) http_opts.model_name = served_model_name(o.model_dir);
  http_opts.max_model_len = cfg.n_positions;
  http_opts.max_queue = o.max_queue;
  auto metrics =
      std::make_shared<MetricsCollector>(MetricsCollectorOptions{http_opts.model_name, cfg.n_positions});
  std::unique_ptr<HttpFront> http;
  actors::ClientSink http_sink;
  if (!http_opts.listen.empty()) {
    http = std::make_unique<HttpFront>(http_opts, dir.tokenizer, metrics);
    http->bind();
    http_sink = http->sink();
  }

  caf::actor_system_config caf_cfg;
  configure_control_plane(caf_cfg, 2);
  caf::actor_system sys{caf_cfg};

  // One socket loop (one thread) for the clients and one for the workers: no
  // number or size of client frames can delay a worker's heartbeat or result.
  transport::LoopOptions client_lo = loop_options(o.max_client_frame_bytes, o.quiet);
  client_lo.max_peer_backlog_frames = o.max_client_backlog_frames;
  // A client whose backlog passes its bound is cut: what was queued for it
  // leaves, then this, then nothing; its jobs end (the router hears "gone").
  client_lo.lagging_farewell = [](transport::SocketId, const std::string&) {
    return transport::encode(transport::Error{
        transport::ErrorCode::kTooSlow,
        "this client read its replies too slowly: the server stopped sending and ended its open jobs",
        std::nullopt});
  };
  transport::SocketLoop client_loop(client_lo);
  transport::SocketLoop worker_loop(loop_options(o.max_frame_bytes, o.quiet));
  const transport::SocketId frontend =
      client_loop.add_socket(server_socket(o.listen, "frontend", o.client_keys, o.insecure));
  const transport::SocketId backend =
      worker_loop.add_socket(server_socket(o.worker_listen, "backend", o.worker_keys, o.insecure));

  std::shared_ptr<core::StepLog> step_log;
  if (!o.step_log.empty() && !(step_log = core::StepLog::to_file(o.step_log)))
    throw std::runtime_error("--step-log " + o.step_log + ": cannot write it");
  actors::batcher_actor batcher = actors::spawn_batcher(sys, o.batcher, step_log);
  actors::RouterOptions ro;
  ro.max_queue = o.max_queue;
  ro.max_model_len = cfg.n_positions;
  ro.vocab_size = cfg.vocab_size;
  ro.eos_id = cfg.eos_token_id;
  ro.seed = o.seed;
  // A reply the client loop cannot take ends that client's jobs (the router
  // hears "gone"), as a client that vanished: never a silent gap in a stream.
  auto router_ref = std::make_shared<std::optional<actors::router_actor>>();
  auto unsent = [router_ref, &client_loop](const std::string& client) {
    client_loop.log("frontend: a reply for a client could not be queued; its jobs end");
    if (*router_ref) caf::anon_send(**router_ref, actors::gone_atom::value, client);
  };
  actors::ClientSink sink =
      [metrics, http_sink,
       zmq_sink = zmq_client_sink(client_loop, frontend, o.max_queue, unsent)](const actors::Reply& r) {
        metrics->observe(r, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count());
        if (!r.client.empty() && r.client[0] == 'h') {
          if (http_sink) http_sink(r);
        } else {
          zmq_sink(r);
        }
      };
  actors::router_actor router = actors::spawn_router(sys, dir.tokenizer, ro, batcher, std::move(sink));
  *router_ref = router;

  GatewayConfig gc;
  gc.loop = &worker_loop;
  gc.backend = backend;
  gc.arrivals = std::make_shared<transport::ArrivalClock>();
  gc.worker_template = sched;
  gc.membership.liveness = transport::LivenessOptions{o.heartbeat, o.liveness};
  gc.membership.fingerprint = fingerprint;
  gc.membership.vocab_size = cfg.vocab_size;
  gc.membership.max_nodes = o.max_nodes;
  gc.membership.kv_bytes_per_token = model::PagedKvCache::bytes_per_block(cfg, 1);
  gc.local = local_workers(o, dir, sched, local_cost);
  gc.log = [quiet = o.quiet](const std::string& line) { log_line(quiet, line); };
  const size_t num_local = gc.local.size();
  const auto arrivals = gc.arrivals;
  caf::actor gateway = spawn_gateway(sys, std::move(gc), batcher);
  caf::anon_send(batcher, actors::listen_atom::value, router, gateway);
  Fatal fatal;  // before the guard: its watchers may fire while the guard stops the actors
  // From here on every way out stops the actors first (a failed bind included).
  ShutdownGuard guard(sys,
                      {gateway, caf::actor_cast<caf::actor>(router), caf::actor_cast<caf::actor>(batcher)},
                      "troupe serve", o.quiet);
  fatal.watch(sys, caf::actor_cast<caf::actor>(router), "router");
  fatal.watch(sys, caf::actor_cast<caf::actor>(batcher), "batcher");
  fatal.watch(sys, gateway, "gateway");

  worker_loop.on_frame(transport::decode_frames(
      worker_loop, [&, arrivals](transport::SocketId, const std::string& peer, transport::Message&& m) {
        arrivals->stamp(peer, transport::Clock::now());
        if (TROUPE_FAILPOINT("head.recv").action == fail::Action::kDrop) return;
        caf::anon_send(gateway, frame_atom::value, peer, std::move(m));
      }));
  transport::SubmitLimits limits;
  limits.max_prompt_ids = static_cast<size_t>(cfg.n_positions);
  limits.max_prompt_bytes = static_cast<size_t>(cfg.n_positions) * 64;  // as the router's text bound
  client_loop.on_frame(transport::decode_frames(
      client_loop,
      [&](transport::SocketId, const std::string& peer, transport::Message&& m) {
        if (TROUPE_FAILPOINT("head.recv_client").action == fail::Action::kDrop) return;
        forward_client_message(client_loop, frontend, router, peer, std::move(m));
      },
      limits));
  auto client_gone = [&](transport::SocketId, const std::string& peer) {
    caf::anon_send(router, actors::gone_atom::value, zmq_client_id(peer));
    metrics->forget(zmq_client_id(peer));
  };
  client_loop.on_undeliverable(client_gone);
  client_loop.on_lagging(client_gone);
  worker_loop.start();
  client_loop.start();
  if (http) http->start(router);

  model::release_weights(dir);
  log_line(o.quiet, "serving " + o.model_dir + " with " + std::to_string(num_local) +
                        " local worker(s); clients " + client_loop.endpoint(frontend) + ", workers " +
                        worker_loop.endpoint(backend) + (http ? ", HTTP http://" + http->endpoint() : ""));
  if (!o.ready_file.empty()) {
    std::ofstream rf(o.ready_file + ".tmp");
    rf << "listen=" << client_loop.endpoint(frontend) << "\nworker_listen=" << worker_loop.endpoint(backend)
       << "\n";
    if (http) rf << "http=" << http->endpoint() << "\n";
    rf.close();
    std::rename((o.ready_file + ".tmp").c_str(), o.ready_file.c_str());
  }

  // Serve until a termination signal (then drain) or until one of the head's
  // own actors dies (then stop at once: nothing can be served without it).
  while (!fatal.set() && !signals.wait(std::chrono::milliseconds(200))) {
  }
  int status = 0;
  if (fatal.set()) {
    log_line(false, "stopping: " + fatal.what());
    status = 70;  // EX_SOFTWARE
  } else {
    log_line(o.quiet, "stopping: no new jobs; finishing the ones in flight");
    caf::anon_send(router, actors::shutdown_atom::value);
    const auto deadline = std::chrono::steady_clock::now() + o.drain_timeout;
    caf::scoped_actor self{sys};  // gone before the guard waits for every actor (it counts as one)
    bool idle = false, second_signal = false;
    while (!idle && !second_signal && !fatal.set() && std::chrono::steady_clock::now() < deadline) {
      self->request(router, std::chrono::seconds(5), actors::idle_atom::value)
          .receive([&](bool i) { idle = i; },
                   [&](caf::error& e) {
                     log_line(o.quiet, "router does not answer (" + sys.render(e) + "); stopping");
                     idle = true;
                   });
      if (!idle) second_signal = signals.wait(std::chrono::milliseconds(100)).has_value();  // stop now
    }
    if (!idle) {
      // Every job still open ends with an error its client sees (a stream's
      // last chunk, submit's error line), not with a connection that drops.
      const std::string why =
          "the server stopped before this job finished (" +
          (second_signal ? std::string("a second stop signal")
                         : "--drain-timeout " + std::to_string(o.drain_timeout.count()) + " s ran out") +
          ")";
      self->request(router, std::chrono::seconds(5), actors::abort_atom::value, why)
          .receive(
              [&](int32_t n) { log_line(o.quiet, std::to_string(n) + " job(s) unfinished: " + why); },
              [&](caf::error& e) { log_line(o.quiet, "router does not answer (" + sys.render(e) + ")"); });
    }
  }
  if (http) http->stop();                      // after the streams' last chunks (it waits for them)
  client_loop.flush(std::chrono::seconds(2));  // the clients' last frames leave before the sockets close
  client_loop.stop();
  worker_loop.stop();
  guard.stop(status);
  log_line(o.quiet, "stopped");
  return status;
}

}  // namespace troupe::cluster
