#pragma once
// The head process (`troupe serve`): the router and the batcher, the client
// socket (ZeroMQ ROUTER, the wire of transport/protocol.hpp), the backend
// socket where worker nodes join, and any number of local workers. It runs
// until SIGTERM or SIGINT, then stops taking jobs, finishes what is in flight
// (bounded by drain_timeout, or until a second signal: the jobs still open
// then end with an error their clients see) and exits 0.
//
//   clients ─▶ frontend ─▶ router ─▶ batcher ─▶ local workers (detached actors, the model)
//   HTTP clients ─▶ HTTP front ─┘ (optional: cluster/http/http_front.hpp)
//                                       │  ▲
//                                       ▼  │
//              backend ◀─▶ gateway ◀─▶ proxies ◀─frames─▶ worker nodes (`troupe worker --join`)
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cluster/http/http_front.hpp"
#include "core/batcher.hpp"
#include "core/scheduler.hpp"
#include "transport/socket_loop.hpp"

namespace troupe::cluster {

struct HeadOptions {
  std::string model_dir;                        // the model (tokenizer, config; weights for local workers)
  std::string listen = "tcp://127.0.0.1:5555";  // clients (port * = any free port)
  std::string worker_listen = "tcp://127.0.0.1:5556";  // worker nodes
  std::vector<std::string> devices = {"cpu"};          // one local worker per entry ("cpu", "cuda:0")
  int32_t workers = 1;               // local CPU workers when devices == {"cpu"}; 0 = head alone
  int32_t threads_per_worker = 0;    // 0 = the usable CPUs split among the local workers
  std::string dtype = "float32";     // the local workers' weights (--dtype); nodes must run the same
  std::string kv_cache_dtype = "auto";  // the local workers' KV storage (--kv-cache-dtype); nodes the same
  bool allow_mixed_dtypes = false;   // --allow-mixed-dtypes: take nodes of another --dtype
  core::SchedulerOptions scheduler;  // budgets (seqs, tokens, block size, prefix caching);
                                     // the model's facts and the pool size are filled in
  std::string kv_memory = "2GiB";    // KV pool of each local worker
  int32_t num_blocks = 0;            // overrides kv_memory; 0 = from kv_memory
  core::BatcherOptions batcher;  // placement, and the step deadlines (--step-timeout)
  int32_t max_queue = 1024;  // jobs waiting to start, at most; past it: busy
  uint64_t seed = 0;         // base of the seeds the router draws
  size_t max_frame_bytes = transport::kDefaultMaxFrameBytes;               // the worker socket's frames
  size_t max_client_frame_bytes = transport::kDefaultMaxClientFrameBytes;  // the client socket's frames
  // CurveZMQ, one key pair for both sockets and a list of allowed keys for
  // each: a key allowed on one socket is refused on the other (clients
  // cannot join as workers). nullopt = plaintext.
  std::optional<transport::CurveServerKeys> client_keys;  // the client socket (--curve-client-keys)
  std::optional<transport::CurveServerKeys> worker_keys;  // the worker socket (--curve-worker-keys)
  uint32_t max_nodes = 64;   // worker nodes at once; another is refused
  // Frames queued for one client past what ZeroMQ holds (it reads too
  // slowly); past it the client is cut with a `too_slow` error and its jobs end.
  size_t max_client_backlog_frames = 10000;
  std::string cost_profile;  // the local workers' step-cost model (troupe profile's cost.json); "" = fitted
  bool insecure = false;                            // allow a non-loopback bind without keys
  std::chrono::milliseconds heartbeat{1000};        // with worker nodes
  int liveness = 3;                                 // missed heartbeats before a node is lost (3..5)
  std::chrono::seconds drain_timeout{60};           // at SIGTERM: how long in-flight jobs may take
  HttpOptions http;  // the OpenAI-compatible front: listen "" = none; model_name "" = the model
                     // folder's name; max_model_len is filled in
  std::string ready_file;                           // written with the bound endpoints once serving
  std::string step_log;  // every step the workers run, one JSON line each (core/step_log.hpp); "" = none
  bool quiet = false;                               // no log lines on stderr
};

// Runs the head until a termination signal. Returns the exit status.
// Throws std::invalid_argument / std::runtime_error when it cannot start.
int run_head(const HeadOptions& options);

}  // namespace troupe::cluster
