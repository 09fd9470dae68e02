// troupe serve | worker: the head and a worker node (keygen: key_commands.cpp).
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cli/model_flags.hpp"
#include "cli/scheduler_flags.hpp"
#include "cluster/head.hpp"
#include "cluster/node.hpp"
#include "transport/curve_keys.hpp"
#include "transport/endpoint_policy.hpp"

namespace troupe::cli {
namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) throw std::invalid_argument("empty entry in the list '" + text + "'");
    parse_device(item);  // checks it
    out.push_back(item);
  }
  if (out.empty()) throw std::invalid_argument("--devices needs at least one device");
  return out;
}

struct ServeFlags {
  cluster::HeadOptions head;
  SchedulerFlags sched;
  std::string devices, placement = "prefix-affinity", secret_key, client_keys, worker_keys, allowed_keys;
  int heartbeat_ms = 1000, drain_timeout_s = 60;
  double step_timeout_s = 5, step_timeout_margin = 8, step_timeout_cold_s = 60;
};

// The CurveZMQ keys of `serve`: one key pair, and for each socket the keys
// it lets in. A key has one role: one that would be let in on both sockets
// is refused at start. With a secret key both sockets use CurveZMQ, and a
// socket without its list lets nobody in (no --curve-worker-keys: no node
// can join; the head's own workers still serve).
void set_curve_keys(ServeFlags& f) {
  cluster::HeadOptions& h = f.head;
  if (!f.allowed_keys.empty()) {
    if (!f.client_keys.empty())
      throw std::invalid_argument("--curve-allowed-keys is the old name of --curve-client-keys: give one");
    std::fprintf(
        stderr,
        "troupe serve: warning: --curve-allowed-keys is deprecated; it names the clients' keys "
        "(--curve-client-keys) and lets no worker node join: give theirs with --curve-worker-keys\n");
    f.client_keys = f.allowed_keys;
  }
  const bool any_list = !f.client_keys.empty() || !f.worker_keys.empty();
  if (f.secret_key.empty() != !any_list) {
    throw std::invalid_argument(
        "CurveZMQ needs --curve-secret-key and the keys let in: --curve-client-keys (clients) and/or "
        "--curve-worker-keys (worker nodes)");
  }
  if (f.secret_key.empty()) return;
  const std::string secret = transport::read_secret_key_file(f.secret_key).secret_key;
  std::vector<std::string> clients, workers;
  if (!f.client_keys.empty()) clients = transport::read_public_keys(f.client_keys);
  if (!f.worker_keys.empty()) workers = transport::read_public_keys(f.worker_keys);
  for (const std::string& k : clients) {
    if (std::find(workers.begin(), workers.end(), k) != workers.end())
      throw std::invalid_argument("the key " + k +
                                  " is both a client's and a worker's: a key has one role (make one per node "
                                  "and per client with troupe keygen)");
  }
  h.client_keys = transport::CurveServerKeys{secret, clients};
  h.worker_keys = transport::CurveServerKeys{secret, workers};
}

int run_serve(ServeFlags f) {
  cluster::HeadOptions& h = f.head;
  if (!f.devices.empty()) h.devices = split_list(f.devices);
  h.scheduler.max_num_seqs = f.sched.max_num_seqs;
  h.scheduler.max_num_batched_tokens = f.sched.max_batched_tokens;
  h.scheduler.block_size = f.sched.block_size;
  h.scheduler.enable_prefix_caching = !f.sched.no_prefix_caching;
  h.kv_memory = f.sched.kv_memory;
  h.num_blocks = f.sched.num_blocks;
  h.seed = f.sched.seed;
  h.batcher.placement = core::parse_placement(f.placement);
  h.heartbeat = std::chrono::milliseconds(f.heartbeat_ms);
  h.drain_timeout = std::chrono::seconds(f.drain_timeout_s);
  h.batcher.step_timeout_floor_ns = static_cast<int64_t>(f.step_timeout_s * 1e9);
  h.batcher.step_timeout_margin = f.step_timeout_margin;
  h.batcher.step_timeout_cold_ns = static_cast<int64_t>(f.step_timeout_cold_s * 1e9);
  set_curve_keys(f);
  transport::check_bind_security(h.listen, h.client_keys.has_value(), h.insecure);
  transport::check_bind_security(h.worker_listen, h.worker_keys.has_value(), h.insecure);
  if (!h.http.api_key.empty() && h.http.listen.empty()) {
    throw std::invalid_argument("--api-key protects the HTTP front: give --http HOST:PORT too");
  }
  h.http.insecure = h.insecure;
  if (!h.http.listen.empty())
    cluster::check_http_bind_security(h.http.listen, !h.http.api_key.empty(), h.insecure);
  return cluster::run_head(h);
}

struct WorkerFlags {
  cluster::NodeOptions node;
  std::string devices, secret_key, server_key;
  int drain_timeout_s = 120, join_timeout_s = 30;
};

int run_worker(WorkerFlags f) {
  cluster::NodeOptions& n = f.node;
  if (!f.devices.empty()) n.devices = split_list(f.devices);
  n.drain_timeout = std::chrono::seconds(f.drain_timeout_s);
  n.join_timeout = std::chrono::seconds(f.join_timeout_s);
  n.curve = transport::client_keys(f.secret_key, f.server_key);
  return cluster::run_node(n);
}

void add_curve_server_flags(CLI::App* sub, ServeFlags& f) {
  sub->add_option("--curve-secret-key", f.secret_key,
                  "CurveZMQ: this server's secret key file (troupe keygen)");
  sub->add_option("--curve-client-keys", f.client_keys,
                  "CurveZMQ: public keys of the clients let in on --listen (a .pub file, a file of keys, or "
                  "a folder of .pub files); refused on --worker-listen");
  sub->add_option("--curve-worker-keys", f.worker_keys,
                  "CurveZMQ: public keys of the worker nodes let in on --worker-listen; refused on --listen "
                  "(none given: no node can join)");
  sub->add_option("--curve-allowed-keys", f.allowed_keys,
                  "Deprecated: the old name of --curve-client-keys (clients only, never workers)");
  sub->add_flag("--insecure", f.head.insecure,
                "Allow binding a non-loopback address without CurveZMQ keys (or, for --http, an --api-key)");
}

}  // namespace

void add_cluster_commands(CLI::App& app, Registry& registry) {
  {
    auto* sub =
        app.add_subcommand("serve", "Run the head (router + batcher) and local workers until SIGTERM");
    auto f = std::make_shared<ServeFlags>();
    cluster::HeadOptions& h = f->head;
    sub->add_option("--model", h.model_dir, "Model folder")->required();
    sub->add_option("--listen", h.listen, "Client endpoint (port * = any free port)");
    sub->add_option("--worker-listen", h.worker_listen, "Endpoint where worker nodes join");
    sub->add_option("--workers", h.workers, "Local CPU workers (0 = a head alone)")->check(CLI::Range(0, 64));
    sub->add_option("--devices", f->devices, "Local workers, one per device: cpu or cuda:0,cuda:1");
    sub->add_option("--threads-per-worker", h.threads_per_worker,
                    "Threads of each local worker (0 = the usable CPUs split among them)")
        ->check(non_negative_number());
    add_dtype_flags(sub, h.dtype);
    add_kv_cache_dtype_flag(sub, h.kv_cache_dtype);
    sub->add_flag("--allow-mixed-dtypes", h.allow_mixed_dtypes,
                  "Take worker nodes whose --dtype or --kv-cache-dtype differs from this head's (their tokens "
                  "may differ)");
    add_scheduler_flags(*sub, f->sched);
    sub->add_option("--max-queue", h.max_queue,
                    "Jobs waiting to start at most; past it a job gets 'busy' at once")
        ->check(non_negative_number());
    sub->add_option("--placement", f->placement, "round-robin | least-loaded | prefix-affinity");
    sub->add_option("--step-log", h.step_log,
                    "Write every step the workers run to this file, one JSON line each (for troupe profile "
                    "--calibrate-with)");
    sub->add_option("--max-frame-bytes", h.max_frame_bytes, "Largest frame accepted on --worker-listen")
        ->check(positive_number());
    sub->add_option("--max-client-frame-bytes", h.max_client_frame_bytes,
                    "Largest frame accepted on --listen (a submit is read only when it fits)")
        ->check(positive_number());
    sub->add_option("--max-client-backlog", h.max_client_backlog_frames,
                    "Frames queued for a client that reads too slowly, past what ZeroMQ holds; past it the "
                    "client gets a too_slow error and its jobs end")
        ->check(positive_number());
    sub->add_option("--max-nodes", h.max_nodes, "Worker nodes at once; another is refused")
        ->check(CLI::Range(1, 100000));
    sub->add_option("--step-timeout", f->step_timeout_s,
                    "Seconds a step may run at least before its worker is hung (its jobs move elsewhere, the "
                    "worker is restarted or its node reset); 0 = no step deadlines")
        ->check(CLI::Range(0.0, 86400.0));
    sub->add_option("--step-timeout-margin", f->step_timeout_margin,
                    "A step may run this many times its predicted cost (if more than --step-timeout)")
        ->check(CLI::Range(1.0, 1000.0));
    sub->add_option("--step-timeout-cold", f->step_timeout_cold_s,
                    "Seconds a step may run whose cost its worker's model cannot predict yet (a new worker, "
                    "a step larger than any it ran)")
        ->check(CLI::Range(0.0, 86400.0));
    sub->add_option(
           "--cost-profile", h.cost_profile,
           "The local workers' step-cost model (troupe profile's cost.json), for the step deadlines; "
           "default: fitted to the steps they serve")
        ->check(CLI::ExistingFile);
    sub->add_option("--heartbeat-ms", f->heartbeat_ms, "Heartbeat interval with worker nodes")
        ->check(CLI::Range(50, 60000));
    sub->add_option("--liveness", h.liveness, "Missed heartbeats before a worker node is lost")
        ->check(CLI::Range(3, 5));
    sub->add_option(
           "--drain-timeout", f->drain_timeout_s,
           "At SIGTERM: seconds in-flight jobs may take; then (or at a second signal) the jobs still "
           "open end with an error their clients see")
        ->check(non_negative_number());
    sub->add_option("--http", h.http.listen,
                    "Also serve OpenAI's completions API over HTTP at HOST:PORT, e.g. 127.0.0.1:8000 "
                    "(port 0 = any free port)");
    sub->add_option("--api-key", h.http.api_key,
                    "HTTP: require 'Authorization: Bearer KEY' on /v1/* (also allows a non-loopback --http)");
    sub->add_option("--served-model-name", h.http.model_name,
                    "HTTP: the model's name in requests and responses (default: the model folder's name)");
    sub->add_option("--http-request-timeout", h.http.request_timeout_s,
                    "HTTP: a non-streamed completion not done after this many seconds gets 504 and its jobs "
                    "are cancelled (0 = no limit)")
        ->check(non_negative_number());
    sub->add_option("--http-threads", h.http.threads,
                    "HTTP: event-loop threads serving every connection and stream (2; before the event loop "
                    "this was the number of connections served at once, and larger values still parse)")
        ->check(CLI::Range(1, 4096));
    sub->add_option("--http-max-connections", h.http.max_connections,
                    "HTTP: connections open at once (4096); past it a new one gets 503 with Retry-After and "
                    "is closed")
        ->check(CLI::Range(1, 1 << 20));
    sub->add_option("--http-max-header-bytes", h.http.max_header_bytes,
                    "HTTP: a request line and header over this many bytes get 431 (16384)")
        ->check(CLI::Range(size_t{1024}, size_t{1} << 20));
    sub->add_option("--http-max-body-bytes", h.http.max_body_bytes,
                    "HTTP: a request body over this many bytes gets 413, before it is read (16 MiB)")
        ->check(CLI::Range(size_t{1024}, size_t{1} << 30));
    sub->add_option("--http-header-timeout", h.http.header_timeout_s,
                    "HTTP: seconds a request's header may take from its first byte (5); then 408")
        ->check(CLI::Range(1, 3600));
    sub->add_option("--http-body-timeout", h.http.body_timeout_s,
                    "HTTP: seconds a request's body may take after its header (30); then 408")
        ->check(CLI::Range(1, 3600));
    sub->add_option("--http-keep-alive", h.http.keep_alive_s,
                    "HTTP: seconds an idle kept-alive connection stays open (5)")
        ->check(CLI::Range(1, 3600));
    sub->add_option("--ready-file", h.ready_file, "Write the bound endpoints here once serving");
    sub->add_flag("--quiet", h.quiet, "No log lines");
    add_curve_server_flags(sub, *f);
    registry.push_back({sub, [f] { return run_serve(*f); }});
  }
  {
    auto* sub = app.add_subcommand("worker", "Bring workers to a head (this host or another) until SIGTERM");
    auto f = std::make_shared<WorkerFlags>();
    cluster::NodeOptions& n = f->node;
    sub->add_option("--join", n.join, "The head's worker endpoint, tcp://HOST:5556")->required();
    sub->add_option("--model", n.model_dir, "Model folder (the same model as the head's)")->required();
    sub->add_option("--workers", n.workers, "CPU workers")->check(CLI::Range(1, 64));
    sub->add_option("--devices", f->devices, "Workers, one per device: cpu or cuda:0,cuda:1");
    sub->add_option("--threads-per-worker", n.threads_per_worker,
                    "Threads of each worker (0 = split the CPUs)")
        ->check(non_negative_number());
    add_dtype_flags(sub, n.dtype);
    add_kv_cache_dtype_flag(sub, n.kv_cache_dtype);
    sub->add_option("--kv-memory", n.kv_memory, "KV cache memory per worker, e.g. 2GiB");
    sub->add_option("--num-blocks", n.num_blocks, "KV blocks per worker (overrides --kv-memory)")
        ->check(positive_number());
    sub->add_option("--block-size", n.block_size, "Token slots per KV block")->check(CLI::Range(1, 1024));
    sub->add_option("--emulate", n.emulate,
                    "Emulate the workers with this cost profile (troupe profile): no model runs, each step "
                    "waits its predicted time")
        ->check(CLI::ExistingFile);
    sub->add_option("--emulate-time-scale", n.emulate_time_scale, "Multiply the emulated step times")
        ->check(positive_number());
    sub->add_option("--name", n.name, "This node's name in the head's status (default host:pid)");
    sub->add_option("--max-frame-bytes", n.max_frame_bytes, "Largest frame accepted");
    sub->add_option("--drain-timeout", f->drain_timeout_s,
                    "At SIGTERM: leave after this many seconds at most")
        ->check(non_negative_number());
    sub->add_option("--join-timeout", f->join_timeout_s,
                    "At start: exit 1 if no head answers within this many seconds (0 = try for ever); once "
                    "joined, a lost head is looked for again for ever")
        ->check(non_negative_number());
    sub->add_option("--cost-profile", n.cost_profile,
                    "This node's step-cost model (troupe profile's cost.json), sent to the head for its step "
                    "deadlines; default: the head fits one to the steps the workers serve")
        ->check(CLI::ExistingFile);
    sub->add_option("--curve-secret-key", f->secret_key,
                    "CurveZMQ: this node's secret key file (troupe keygen)");
    sub->add_option("--curve-server-key", f->server_key,
                    "CurveZMQ: the head's public key (or its .pub file)");
    sub->add_flag("--quiet", n.quiet, "No log lines");
    registry.push_back({sub, [f] { return run_worker(*f); }});
  }
}

}  // namespace troupe::cli
