#pragma once
// Real processes for black-box tests (cluster/loadgen/child_process.hpp), and
// waiting for a condition.
#include <chrono>
#include <thread>

#include "cluster/loadgen/child_process.hpp"

namespace troupe::test {

using Process = cluster::ChildProcess;

// Polls `cond` every `every` (50 ms) until it holds or `timeout` passes.
template <class Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every = std::chrono::milliseconds(50)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(every);
  }
  return cond();
}

}  // namespace troupe::test
