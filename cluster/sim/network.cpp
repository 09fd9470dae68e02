#include "cluster/sim/network.hpp"

#include <algorithm>
#include <cmath>

#include "transport/protocol.hpp"

namespace troupe::cluster::sim {
namespace {

// ZeroMQ's frame header: flags + a 1-byte length, or flags + an 8-byte one.
int64_t with_zmq_framing(size_t body) { return static_cast<int64_t>(body) + (body > 255 ? 9 : 2); }

}  // namespace

int64_t NetworkLink::serialization_ns(int64_t bytes) const {
  if (bandwidth_bytes_per_s <= 0) return 0;
  return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) * 1e9 / bandwidth_bytes_per_s));
}

int64_t Channel::send(int64_t now, int64_t bytes, const NetworkLink& link) {
  const int64_t start = std::max(now, free_at_);
  free_at_ = start + link.serialization_ns(bytes);
  return free_at_ + link.latency_ns;
}

int64_t plan_wire_bytes(const core::StepPlan& plan) {
  return with_zmq_framing(transport::encode(transport::Plan{0, plan}).size());
}

int64_t result_wire_bytes(const core::StepResult& result) {
  return with_zmq_framing(transport::encode(transport::Result{0, result}).size());
}

}  // namespace troupe::cluster::sim
