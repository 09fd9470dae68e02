#pragma once
// What every process of the control plane (the head, a worker node) sets up
// the same way: its CAF actor system, its ZeroMQ socket loops and sockets,
// the frames a loop hands to an actor, and its list of workers.

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "cluster/gateway.hpp"
#include "transport/dispatch.hpp"
#include "transport/socket_loop.hpp"

namespace troupe::cluster {

// CAF's threads handle messages only (forward passes run on detached worker
// actors' own threads). Work sharing, not CAF's default work stealing: an
// idle work-stealing thread polls its queue and its peers', sleeping 50 us
// between tries for its first 500 tries after every message, which on a
// small machine takes CPU from the forward pass running beside it (measured
// in docs/benchmarks.md, "Threading policy"); a work-sharing thread blocks on a condition
// variable until a message comes. TROUPE_CAF_POLICY=stealing brings CAF's
// default back (for measuring the difference).
inline void configure_control_plane(caf::actor_system_config& cfg, size_t threads) {
  const char* policy = std::getenv("TROUPE_CAF_POLICY");
  const bool stealing = policy != nullptr && std::string(policy) == "stealing";
  cfg.set("scheduler.max-threads", threads);
  cfg.set("scheduler.policy", stealing ? caf::atom("stealing") : caf::atom("sharing"));
  cfg.set("logger.verbosity", caf::atom("quiet"));
}

// A process's actor system, configured as above. Not movable (the system
// keeps a reference to its config): hold it where it is made.
struct ControlPlaneSystem {
  explicit ControlPlaneSystem(size_t threads) {
    configure_control_plane(config, threads);
    system = std::make_unique<caf::actor_system>(config);
  }
  caf::actor_system_config config;
  std::unique_ptr<caf::actor_system> system;
};

inline transport::LoopOptions loop_options(size_t max_frame_bytes, bool quiet) {
  transport::LoopOptions lo;
  lo.max_frame_bytes = max_frame_bytes;
  if (quiet) lo.log = [](const std::string&) {};
  return lo;
}

// A socket that binds (the head's client and worker fronts) ...
inline transport::SocketOptions server_socket(const std::string& endpoint, const std::string& name,
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

// ... and one that connects (a node to its head).
inline transport::SocketOptions client_socket(const std::string& endpoint, const std::string& name,
                                              const std::optional<transport::CurveClientKeys>& curve) {
  transport::SocketOptions s;
  s.role = transport::SocketOptions::Role::kClient;
  s.endpoint = endpoint;
  s.name = name;
  s.curve_client = curve;
  return s;
}

// Every frame `loop` decodes goes to `to` as (frame, peer, Message), after
// `on_arrival(peer)` (if given) has seen it and not refused it (false: drop).
inline void frames_to(transport::SocketLoop& loop, caf::actor to,
                      std::function<bool(const std::string& peer)> on_arrival = {}) {
  loop.on_frame(transport::decode_frames(
      loop, [to = std::move(to), on_arrival = std::move(on_arrival)](
                transport::SocketId, const std::string& peer, transport::Message&& m) {
        if (on_arrival && !on_arrival(peer)) return;
        caf::anon_send(to, frame_atom::value, peer, std::move(m));
      }));
}

// The workers of a process, one device each: `devices` as given, or
// `cpu_workers` CPU workers when it is just {"cpu"} (they share the CPUs).
inline std::vector<std::string> worker_devices(const std::vector<std::string>& devices, int cpu_workers) {
  if (devices.size() == 1 && devices[0] == "cpu")
    return std::vector<std::string>(static_cast<size_t>(std::max(cpu_workers, 0)), "cpu");
  return devices;
}

}  // namespace troupe::cluster
