#include "cluster/signals.hpp"

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <ctime>

namespace troupe::cluster {
namespace {

sigset_t termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

SignalWaiter::SignalWaiter() {
  const sigset_t set = termination_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

SignalWaiter::~SignalWaiter() {
  const sigset_t set = termination_signals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

std::optional<int> SignalWaiter::wait(std::chrono::milliseconds timeout) {
  const sigset_t set = termination_signals();
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000) * 1000000);
  const int sig = sigtimedwait(&set, nullptr, &ts);
  if (sig < 0) return std::nullopt;  // EAGAIN (timeout) or EINTR
  return sig;
}

}  // namespace troupe::cluster
