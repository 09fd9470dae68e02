#include "cluster/shutdown_guard.hpp"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/failpoints.hpp"

namespace troupe::cluster {

ShutdownGuard::ShutdownGuard(caf::actor_system& system, std::vector<caf::actor> actors, std::string who,
                             bool quiet, std::chrono::seconds patience)
    : system_(system), actors_(std::move(actors)), who_(std::move(who)), quiet_(quiet), patience_(patience) {}

ShutdownGuard::~ShutdownGuard() { stop(1); }

void ShutdownGuard::stop(int status) {
  if (stopped_) return;
  stopped_ = true;
  fail::release_hangs();
  for (auto& a : actors_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (cv.wait_for(lock, patience_, [&] { return done; })) return;
    if (!quiet_)
      std::fprintf(stderr,
                   "%s: actors still running %lld s after the stop (a worker thread stuck in a step?); "
                   "exiting without them\n",
                   who_.c_str(), static_cast<long long>(patience_.count()));
    std::fflush(stderr);
    std::_Exit(status);
  });
  system_.await_all_actors_done();
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  cv.notify_one();
  watchdog.join();
}

}  // namespace troupe::cluster
