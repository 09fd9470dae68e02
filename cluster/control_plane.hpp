#pragma once
// The settings every troupe process (head, node) gives its CAF actor system
// and its ZeroMQ socket loop.

#include <cstddef>
#include <cstdlib>
#include <string>

#include <caf/all.hpp>

#include "transport/socket_loop.hpp"

namespace troupe::cluster {

// CAF's threads handle messages only (forward passes run on detached worker
// actors' own threads). Work sharing, not CAF's default work stealing: an
// idle work-stealing thread polls its queue and its peers', sleeping 50 us
// between tries for its first 500 tries after every message, which on a
// small machine takes CPU from the forward pass running beside it (measured
// in docs/threading.md); a work-sharing thread blocks on a condition
// variable until a message comes. TROUPE_CAF_POLICY=stealing brings CAF's
// default back (for measuring the difference).
inline void configure_control_plane(caf::actor_system_config& cfg, size_t threads) {
  const char* policy = std::getenv("TROUPE_CAF_POLICY");
  const bool stealing = policy != nullptr && std::string(policy) == "stealing";
  cfg.set("scheduler.max-threads", threads);
  cfg.set("scheduler.policy", stealing ? caf::atom("stealing") : caf::atom("sharing"));
  cfg.set("logger.verbosity", caf::atom("quiet"));
}

inline transport::LoopOptions loop_options(size_t max_frame_bytes, bool quiet) {
  transport::LoopOptions lo;
  lo.max_frame_bytes = max_frame_bytes;
  if (quiet) lo.log = [](const std::string&) {};
  return lo;
}

}  // namespace troupe::cluster
