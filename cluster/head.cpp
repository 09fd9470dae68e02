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
// device (model::models_per_device: the last one built takes dir.weights,
// for serve's peak RSS), each with its own KV pool and threads.
std::vector<LocalWorker> local_workers(const HeadOptions& o, model::ModelDir& dir,
                                       const core::SchedulerOptions& sched, const std::string& cost) {
  const std::vector<std::string> devices = worker_devices(o.devices, o.workers);
  std::vector<LocalWorker> out;
  if (devices.empty()) return out;
  const auto budgets = model::split_thread_budget(model::usable_cpus(), static_cast<int>(devices.size()),
                                                  o.threads_per_worker);
  const model::WeightDtype dtype = model::parse_weight_dtype(o.dtype);
  const auto models = model::models_per_device(dir, devices, dtype);
  for (size_t i = 0; i < devices.size(); ++i) {
    ModelWorkerConfig wc{models.at(devices[i]), sched.num_blocks, sched.block_size, budgets[i],
                         model::parse_kv_cache_dtype(o.kv_cache_dtype, dtype)};
    out.push_back(
        {devices[i], actors::WorkerParams{[wc] { return make_model_runner(wc); }, true, nullptr}, cost});
  }
  return out;
}

// The head's process, its life in named steps: build (the model, the HTTP
// address, the sockets, the actors), start (frames flow, clients are told
// where), serve (until a signal or a dead actor), drain (the jobs in flight
// finish or end visibly) and stop. Members are declared in the order they
// are made, so they are destroyed in reverse: the shutdown guard first (it
// stops the actors), the actor system and the HTTP front last.
class HeadProcess {
 public:
  explicit HeadProcess(const HeadOptions& o) : o_(o), dir_(model::load_model_dir(o.model_dir)) {}

  int run() {
    build_scheduler();
    bind_http();
    build_sockets();
    build_actors();
    start();
    const bool fatal = serve();
    const int status = fatal ? 70 : 0;  // EX_SOFTWARE: one of the head's own actors died
    if (!fatal) drain();
    return stop(status);
  }

 private:
  // The local workers' KV storage, and the one nodes must bring.
  model::KvDtype kv_dtype() const {
    return model::parse_kv_cache_dtype(o_.kv_cache_dtype, model::parse_weight_dtype(o_.dtype));
  }

  // The workers' scheduler settings, from the model and the flags.
  void build_scheduler() {
    const model::Gpt2Config& cfg = dir_.config;
    sched_ = o_.scheduler;
    sched_.max_model_len = cfg.n_positions;
    sched_.vocab_size = cfg.vocab_size;
    sched_.eos_id = cfg.eos_token_id;
    sched_.max_steps_in_flight = 2;
    sched_.num_blocks =
        o_.num_blocks > 0 ? o_.num_blocks : blocks_for_kv_memory(cfg, o_.kv_memory, sched_.block_size, kv_dtype());
    fingerprint_ = model::fingerprint(cfg, dir_.weights);
    if (!o_.cost_profile.empty()) local_cost_ = sim::read_cost_profile(o_.cost_profile).cost.to_json().dump();
  }

  // The HTTP address is bound before any actor starts, so a taken port fails
  // fast and cleanly.
  void bind_http() {
    HttpOptions h = o_.http;
    if (h.model_name.empty()) h.model_name = served_model_name(o_.model_dir);
    h.max_model_len = dir_.config.n_positions;
    h.max_queue = o_.max_queue;
    metrics_ =
        std::make_shared<MetricsCollector>(MetricsCollectorOptions{h.model_name, dir_.config.n_positions});
    if (h.listen.empty()) return;
    http_ = std::make_unique<HttpFront>(h, dir_.tokenizer, metrics_);
    http_->bind();
  }

  // One socket loop (one thread) for the clients and one for the workers: no
  // number or size of client frames can delay a worker's heartbeat or result.
  void build_sockets() {
    actors_ = std::make_unique<ControlPlaneSystem>(2);
    transport::LoopOptions client_lo = loop_options(o_.max_client_frame_bytes, o_.quiet);
    client_lo.max_peer_backlog_frames = o_.max_client_backlog_frames;
    // A client whose backlog passes its bound is cut: what was queued for it
    // leaves, then this, then nothing; its jobs end (the router hears "gone").
    client_lo.lagging_farewell = [](transport::SocketId, const std::string&) {
      return transport::encode(transport::Error{
          transport::ErrorCode::kTooSlow,
          "this client read its replies too slowly: the server stopped sending and ended its open jobs",
          std::nullopt});
    };
    client_loop_ = std::make_unique<transport::SocketLoop>(client_lo);
    worker_loop_ = std::make_unique<transport::SocketLoop>(loop_options(o_.max_frame_bytes, o_.quiet));
    frontend_ = client_loop_->add_socket(server_socket(o_.listen, "frontend", o_.client_keys, o_.insecure));
    backend_ =
        worker_loop_->add_socket(server_socket(o_.worker_listen, "backend", o_.worker_keys, o_.insecure));
  }

  // The batcher, the router (its sink: /metrics, then the client's front)
  // and the gateway (remote and local workers), watched and guarded.
  void build_actors() {
    std::shared_ptr<core::StepLog> step_log;
    if (!o_.step_log.empty() && !(step_log = core::StepLog::to_file(o_.step_log)))
      throw std::runtime_error("--step-log " + o_.step_log + ": cannot write it");
    batcher_ = actors::spawn_batcher(sys(), o_.batcher, step_log);
    actors::RouterOptions ro;
    ro.max_queue = o_.max_queue;
    ro.max_model_len = dir_.config.n_positions;
    ro.vocab_size = dir_.config.vocab_size;
    ro.eos_id = dir_.config.eos_token_id;
    ro.seed = o_.seed;
    router_ = actors::spawn_router(sys(), dir_.tokenizer, ro, batcher_, client_sink());
    *router_ref_ = router_;
    GatewayConfig gc = gateway_config();
    num_local_ = gc.local.size();
    gateway_ = spawn_gateway(sys(), std::move(gc), batcher_);
    caf::anon_send(batcher_, actors::listen_atom::value, router_, gateway_);
    // From here on every way out stops the actors first (a failed bind included).
    guard_ = std::make_unique<ShutdownGuard>(
        sys(),
        std::vector<caf::actor>{gateway_, caf::actor_cast<caf::actor>(router_),
                                caf::actor_cast<caf::actor>(batcher_)},
        "troupe serve", o_.quiet);
    fatal_.watch(sys(), caf::actor_cast<caf::actor>(router_), "router");
    fatal_.watch(sys(), caf::actor_cast<caf::actor>(batcher_), "batcher");
    fatal_.watch(sys(), gateway_, "gateway");
  }

  // Every reply is observed for /metrics, then goes to the front of its
  // client (ClientId::front). A reply the client
  // loop cannot take ends that client's jobs (the router hears "gone"), as a
  // client that vanished: never a silent gap in a stream.
  actors::ClientSink client_sink() {
    auto unsent = [router_ref = router_ref_, loop = client_loop_.get()](const actors::ClientId& client) {
      loop->log("frontend: a reply for a client could not be queued; its jobs end");
      if (*router_ref) caf::anon_send(**router_ref, actors::gone_atom::value, client);
    };
    return
        [metrics = metrics_, http_sink = http_ ? http_->sink() : actors::ClientSink(),
         zmq_sink = zmq_client_sink(*client_loop_, frontend_, o_.max_queue, unsent)](const actors::Reply& r) {
          metrics->observe(r, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now().time_since_epoch())
                                  .count());
          switch (r.client.front) {
            case actors::Front::kHttp:
              if (http_sink) http_sink(r);
              break;
            case actors::Front::kZmq:
              zmq_sink(r);
              break;
          }
        };
  }

  GatewayConfig gateway_config() {
    const model::Gpt2Config& cfg = dir_.config;
    GatewayConfig gc;
    gc.loop = worker_loop_.get();
    gc.backend = backend_;
    gc.arrivals = arrivals_;
    gc.worker_template = sched_;
    gc.membership.liveness = transport::LivenessOptions{o_.heartbeat, o_.liveness};
    gc.membership.fingerprint = fingerprint_;
    gc.membership.dtype = model::to_string(model::parse_weight_dtype(o_.dtype));
    gc.membership.kv_dtype = model::to_string(kv_dtype());
    gc.membership.allow_mixed_dtypes = o_.allow_mixed_dtypes;
    gc.membership.vocab_size = cfg.vocab_size;
    gc.membership.max_nodes = o_.max_nodes;
    gc.membership.kv_values_per_token = 2 * int64_t{cfg.n_layer} * cfg.n_embd;
    gc.local = local_workers(o_, dir_, sched_, local_cost_);
    gc.log = [quiet = o_.quiet](const std::string& line) { log_line(quiet, line); };
    return gc;
  }

  // Frames flow: workers' to the gateway, clients' to the router; the HTTP
  // front serves; the ready file names the endpoints.
  void start() {
    frames_to(*worker_loop_, gateway_, [arrivals = arrivals_](const std::string& peer) {
      arrivals->stamp(peer, transport::Clock::now());
      return TROUPE_FAILPOINT("head.recv").action != fail::Action::kDrop;
    });
    transport::SubmitLimits limits;
    limits.max_prompt_ids = static_cast<size_t>(dir_.config.n_positions);
    limits.max_prompt_bytes =
        static_cast<size_t>(dir_.config.n_positions) * 64;  // as the router's text bound
    client_loop_->on_frame(transport::decode_frames(
        *client_loop_,
        [loop = client_loop_.get(), frontend = frontend_, router = router_](
            transport::SocketId, const std::string& peer, transport::Message&& m) {
          if (TROUPE_FAILPOINT("head.recv_client").action == fail::Action::kDrop) return;
          forward_client_message(*loop, frontend, router, peer, std::move(m));
        },
        limits));
    auto client_gone = [router = router_, metrics = metrics_](transport::SocketId, const std::string& peer) {
      caf::anon_send(router, actors::gone_atom::value, actors::ClientId::zmq(peer));
      metrics->forget(actors::ClientId::zmq(peer));
    };
    client_loop_->on_undeliverable(client_gone);
    client_loop_->on_lagging(client_gone);
    worker_loop_->start();
    client_loop_->start();
    if (http_) http_->start(router_);
    model::release_weights(dir_);
    log_line(o_.quiet, "serving " + o_.model_dir + " with " + std::to_string(num_local_) +
                           " local worker(s); clients " + client_loop_->endpoint(frontend_) + ", workers " +
                           worker_loop_->endpoint(backend_) +
                           (http_ ? ", HTTP http://" + http_->endpoint() : ""));
    write_ready_file();
  }

  void write_ready_file() const {
    if (o_.ready_file.empty()) return;
    std::ofstream rf(o_.ready_file + ".tmp");
    rf << "listen=" << client_loop_->endpoint(frontend_)
       << "\nworker_listen=" << worker_loop_->endpoint(backend_) << "\n";
    if (http_) rf << "http=" << http_->endpoint() << "\n";
    rf.close();
    std::rename((o_.ready_file + ".tmp").c_str(), o_.ready_file.c_str());
  }

  // Serves until a termination signal or until one of the head's own actors
  // dies (nothing can be served without it); true for the latter.
  bool serve() {
    while (!fatal_.set() && !signals_.wait(std::chrono::milliseconds(200))) {
    }
    if (fatal_.set()) log_line(false, "stopping: " + fatal_.what());
    return fatal_.set();
  }

  // No new jobs; the ones in flight may finish for --drain-timeout (or until
  // a second signal), then every job still open ends with an error its client
  // sees (a stream's last chunk, submit's error line), not a dropped connection.
  void drain() {
    log_line(o_.quiet, "stopping: no new jobs; finishing the ones in flight");
    caf::anon_send(router_, actors::shutdown_atom::value);
    const auto deadline = std::chrono::steady_clock::now() + o_.drain_timeout;
    caf::scoped_actor self{sys()};  // gone before the guard waits for every actor (it counts as one)
    bool idle = false, second_signal = false;
    while (!idle && !second_signal && !fatal_.set() && std::chrono::steady_clock::now() < deadline) {
      self->request(router_, std::chrono::seconds(5), actors::idle_atom::value)
          .receive([&](bool i) { idle = i; },
                   [&](caf::error& e) {
                     log_line(o_.quiet, "router does not answer (" + sys().render(e) + "); stopping");
                     idle = true;
                   });
      if (!idle) second_signal = signals_.wait(std::chrono::milliseconds(100)).has_value();  // stop now
    }
    if (idle) return;
    const std::string why =
        "the server stopped before this job finished (" +
        (second_signal ? std::string("a second stop signal")
                       : "--drain-timeout " + std::to_string(o_.drain_timeout.count()) + " s ran out") +
        ")";
    self->request(router_, std::chrono::seconds(5), actors::abort_atom::value, why)
        .receive(
            [&](int32_t n) { log_line(o_.quiet, std::to_string(n) + " job(s) unfinished: " + why); },
            [&](caf::error& e) { log_line(o_.quiet, "router does not answer (" + sys().render(e) + ")"); });
  }

  caf::actor_system& sys() { return *actors_->system; }

  int stop(int status) {
    if (http_) http_->stop();                      // after the streams' last chunks (it waits for them)
    client_loop_->flush(std::chrono::seconds(2));  // the clients' last frames leave before the sockets close
    client_loop_->stop();
    worker_loop_->stop();
    guard_->stop(status);
    log_line(o_.quiet, "stopped");
    return status;
  }

  const HeadOptions& o_;
  SignalWaiter signals_;  // before any thread starts
  model::ModelDir dir_;
  core::SchedulerOptions sched_;
  uint64_t fingerprint_ = 0;
  std::string local_cost_;
  std::shared_ptr<MetricsCollector> metrics_;
  std::unique_ptr<HttpFront> http_;
  std::unique_ptr<ControlPlaneSystem> actors_;
  std::unique_ptr<transport::SocketLoop> client_loop_, worker_loop_;
  transport::SocketId frontend_{}, backend_{};
  std::shared_ptr<std::optional<actors::router_actor>> router_ref_ =
      std::make_shared<std::optional<actors::router_actor>>();
  std::shared_ptr<transport::ArrivalClock> arrivals_ = std::make_shared<transport::ArrivalClock>();
  actors::batcher_actor batcher_;
  actors::router_actor router_;
  caf::actor gateway_;
  size_t num_local_ = 0;
  Fatal fatal_;  // before the guard: its watchers may fire while the guard stops the actors
  std::unique_ptr<ShutdownGuard> guard_;
};

}  // namespace

int run_head(const HeadOptions& o) { return HeadProcess(o).run(); }

}  // namespace troupe::cluster
