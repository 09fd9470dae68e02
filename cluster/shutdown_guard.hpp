#pragma once
// Ends a process's actors, always: at a normal stop and on the way out of a
// start that failed (an exception between spawning the actors and serving:
// a port in use). Without it, actors that re-arm their timers keep
// ~actor_system waiting for ever and the process hangs with nothing said.
//
// stop() sends an exit to the given actors (the ones they spawned leave with
// them), releases failpoint hangs, and waits for every actor of the system
// to finish. A worker thread stuck inside a step cannot be waited for:
// after `patience` the process ends at once with the status it was going to
// have, and says so.
#include <chrono>
#include <string>
#include <vector>

#include <caf/all.hpp>

namespace troupe::cluster {

class ShutdownGuard {
 public:
  ShutdownGuard(caf::actor_system& system, std::vector<caf::actor> actors, std::string who, bool quiet,
                std::chrono::seconds patience = std::chrono::seconds(10));
  ~ShutdownGuard();  // stop(1) unless stopped
  ShutdownGuard(const ShutdownGuard&) = delete;
  ShutdownGuard& operator=(const ShutdownGuard&) = delete;

  void add(caf::actor actor) { actors_.push_back(std::move(actor)); }
  // Idempotent. Returns once every actor is done, or ends the process with `status`.
  void stop(int status);

 private:
  caf::actor_system& system_;
  std::vector<caf::actor> actors_;
  std::string who_;
  bool quiet_;
  std::chrono::seconds patience_;
  bool stopped_ = false;
};

}  // namespace troupe::cluster
