#pragma once
// A worker node (`troupe worker --join`): one process that brings workers to
// a head, on this host or another. It registers (model fingerprint, each
// worker's KV pool), then runs the plans the head sends on its workers and
// sends back their results, heartbeating on the same socket.
//
//   head ◀──frames──▶ SocketLoop thread ──(frame)──▶ node gateway ──(plan)──▶ workers (detached, the model)
//                                        ◀──(result)── node gateway ◀──(result)──┘
//
// States:
//
//   REGISTERING ──registered──▶ MEMBER ──SIGTERM──▶ DRAINING ──shutdown, drain timeout──▶ exit 0
//     │  ▲  (register again with backoff,       │  heartbeats carry each worker's progress;
//     │  │   each retry logged)                 │  plans run once, in step order; results kept
//     │  └── head silent for `liveness` beats, ─┘  until acked, resent when the head lacks them
//     │      `reset` (a worker hung), "not a member": fresh workers, new connection
//     └── refused, or no head within join_timeout at start ──▶ exit 1
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "transport/socket_loop.hpp"

namespace troupe::cluster {

struct NodeOptions {
  std::string join;  // the head's worker endpoint, tcp://HOST:5556
  std::string name;  // this node in the head's status; "" = host:pid
  std::string model_dir;
  std::vector<std::string> devices = {"cpu"};  // one worker per entry
  int32_t workers = 1;                         // CPU workers when devices == {"cpu"}
  int32_t threads_per_worker = 0;              // 0 = usable CPUs split among the workers
  std::string dtype = "float32";               // the workers' weights (--dtype), told to the head
  std::string kv_cache_dtype = "auto";         // their KV storage (--kv-cache-dtype), told too
  std::string kv_memory = "2GiB";              // KV pool per worker
  int32_t num_blocks = 0;                      // overrides kv_memory
  int32_t block_size = 16;
  size_t max_frame_bytes = transport::kDefaultMaxFrameBytes;
  std::optional<transport::CurveClientKeys> curve;  // nullopt = plaintext
  std::chrono::seconds drain_timeout{120};          // SIGTERM: exit after this even without the head's word
  // At start: no head answered within this long = exit 1 (0 = try for ever).
  // Once it has been a member, a node that loses its head tries for ever.
  std::chrono::seconds join_timeout{30};
  // Its workers' step-cost model (`troupe profile`'s cost.json), sent to the
  // head for its step deadlines; "" = the head fits one to their steps.
  std::string cost_profile;
  bool quiet = false;
  // Emulated workers (`--emulate cost.json`): no model runs; each step waits
  // the time the cost profile predicts (times time_scale). "" = real workers.
  std::string emulate;
  double emulate_time_scale = 1.0;
};

// Runs the node until the head sends shutdown, refuses it (exit status 1),
// or a termination signal has been handled (drain). Returns the exit status.
int run_node(const NodeOptions& options);

}  // namespace troupe::cluster
