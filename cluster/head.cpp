#include "cluster/head.hpp"

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include "actors/batcher_actor.hpp"
#include "actors/router_actor.hpp"
#include "actors/worker_actor.hpp"
#include "cluster/control_plane.hpp"
#include "cluster/gateway.hpp"
#include "cluster/http_front.hpp"
#include "cluster/metrics_collector.hpp"
#include "cluster/model_worker.hpp"
#include "cluster/signals.hpp"
#include "cluster/zmq_front.hpp"
#include "model/cpu_count.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/threading.hpp"
#include "transport/dispatch.hpp"

namespace troupe::cluster {
namespace {

void log_line(bool quiet, const std::string& line) {
  if (!quiet) std::cerr << "troupe serve: " << line << std::endl;
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

  transport::SocketLoop loop(loop_options(o.max_frame_bytes, o.quiet));
  transport::SocketOptions front_opts;
  front_opts.role = transport::SocketOptions::Role::kServer;
  front_opts.endpoint = o.listen;
  front_opts.name = "frontend";
  front_opts.curve_server = o.curve;
  front_opts.insecure = o.insecure;
  transport::SocketOptions back_opts = front_opts;
  back_opts.endpoint = o.worker_listen;
  back_opts.name = "backend";
  const transport::SocketId frontend = loop.add_socket(front_opts);
  const transport::SocketId backend = loop.add_socket(back_opts);

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
  actors::ClientSink sink =
      [metrics, http_sink, zmq_sink = zmq_client_sink(loop, frontend, o.max_queue)](const actors::Reply& r) {
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

  const std::vector<std::string> devices = local_devices(o);
  GatewayConfig gc;
  gc.loop = &loop;
  gc.backend = backend;
  gc.worker_template = sched;
  gc.membership.liveness = transport::LivenessOptions{o.heartbeat, o.liveness};
  gc.membership.fingerprint = fingerprint;
  gc.membership.vocab_size = cfg.vocab_size;
  gc.first_worker_id = devices.size() + 1;
  caf::actor gateway = spawn_gateway(sys, gc, batcher);
  caf::anon_send(batcher, actors::listen_atom::value, router, gateway);

  loop.on_frame(transport::decode_frames(
      loop, [&](transport::SocketId s, const std::string& peer, transport::Message&& m) {
        if (s == backend) {
          caf::anon_send(gateway, frame_atom::value, peer, std::move(m));
        } else {
          forward_client_message(loop, frontend, router, peer, std::move(m));
        }
      }));
  loop.on_undeliverable([&](transport::SocketId s, const std::string& peer) {
    if (s != frontend) return;
    caf::anon_send(router, actors::gone_atom::value, zmq_client_id(peer));
    metrics->forget(zmq_client_id(peer));
  });
  loop.start();
  if (http) http->start(router);

  // Local workers: the weights are shared per device, each has its own pool and threads.
  std::vector<actors::worker_actor> local;
  if (!devices.empty()) {
    const int cpus = model::usable_cpus();
    const auto budgets =
        model::split_thread_budget(cpus, static_cast<int>(devices.size()), o.threads_per_worker);
    std::map<std::string, std::shared_ptr<const model::Gpt2>> models;
    for (size_t i = 0; i < devices.size(); ++i) {
      auto& m = models[devices[i]];
      if (!m) m = std::make_shared<model::Gpt2>(cfg, dir.weights, c10::Device(devices[i]));
      ModelWorkerConfig wc{m, sched.num_blocks, sched.block_size, budgets[i]};
      auto w = actors::spawn_worker(sys, actors::WorkerParams{[wc] { return make_model_runner(wc); }, true},
                                    batcher);
      local.push_back(w);
      core::WorkerSpec spec{i + 1, "local", devices[i], sched};
      caf::scoped_actor self{sys};
      std::string err;
      self->request(batcher, std::chrono::seconds(30), actors::wjoin_atom::value, spec, w)
          .receive([&](const std::string& e) { err = e; }, [&](caf::error& e) { err = sys.render(e); });
      if (!err.empty()) throw std::runtime_error("local worker " + std::to_string(i + 1) + ": " + err);
    }
  }
  model::release_weights(dir);
  log_line(o.quiet, "serving " + o.model_dir + " with " + std::to_string(local.size()) +
                        " local worker(s); clients " + loop.endpoint(frontend) + ", workers " +
                        loop.endpoint(backend) + (http ? ", HTTP http://" + http->endpoint() : ""));
  if (!o.ready_file.empty()) {
    std::ofstream rf(o.ready_file + ".tmp");
    rf << "listen=" << loop.endpoint(frontend) << "\nworker_listen=" << loop.endpoint(backend) << "\n";
    if (http) rf << "http=" << http->endpoint() << "\n";
    rf.close();
    std::rename((o.ready_file + ".tmp").c_str(), o.ready_file.c_str());
  }

  // Serve until a termination signal, then drain.
  while (!signals.wait(std::chrono::milliseconds(500))) {
  }
  log_line(o.quiet, "stopping: no new jobs; finishing the ones in flight");
  caf::anon_send(router, actors::shutdown_atom::value);
  const auto deadline = std::chrono::steady_clock::now() + o.drain_timeout;
  {
    caf::scoped_actor self{sys};  // gone before await_all_actors_done (it counts as an actor)
    bool idle = false, second_signal = false;
    while (!idle && !second_signal && std::chrono::steady_clock::now() < deadline) {
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
  if (http) http->stop();               // after the streams' last chunks (it waits for them)
  loop.flush(std::chrono::seconds(2));  // the clients' last frames leave before the sockets close
  loop.stop();
  for (auto& w : local) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(gateway, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(batcher, caf::exit_reason::user_shutdown);
  sys.await_all_actors_done();
  log_line(o.quiet, "stopped");
  return 0;
}

}  // namespace troupe::cluster
