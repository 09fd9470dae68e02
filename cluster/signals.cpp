#include "cluster/signals.hpp"

#include <signal.h>

#include <atomic>
#include <thread>

namespace troupe::cluster {
namespace {

// The last termination signal taken, 0 when none is pending. A handler
// rather than a signal mask: threads started before the waiter (libgomp's,
// OpenBLAS's) would otherwise take the signal with its default action.
std::atomic<int> pending{0};

void on_signal(int sig) { pending.store(sig); }

struct sigaction previous_int, previous_term;

}  // namespace

SignalWaiter::SignalWaiter() {
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &previous_int);
  sigaction(SIGTERM, &sa, &previous_term);
}

SignalWaiter::~SignalWaiter() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

std::optional<int> SignalWaiter::wait(std::chrono::milliseconds timeout) {
  const auto step = std::chrono::milliseconds(20);
  for (auto waited = std::chrono::milliseconds(0);; waited += step) {
    if (int sig = pending.exchange(0); sig != 0) return sig;
    if (waited >= timeout) return std::nullopt;
    std::this_thread::sleep_for(step);
  }
}

}  // namespace troupe::cluster
