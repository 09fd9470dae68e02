#pragma once
// The network between the head (batcher) and a worker, as the simulator sees
// it: each message takes latency + bytes / bandwidth, and messages on one
// link in one direction are serialised and arrive in order (ZeroMQ over one
// TCP connection). Message sizes are exact: the transport's own encoding of
// the plan or result (transport/protocol.hpp) plus ZeroMQ's frame header.
#include <cstdint>

#include "core/step_plan.hpp"

namespace troupe::cluster::sim {

struct NetworkLink {
  int64_t latency_ns = 0;            // one way, per message; >= 0
  double bandwidth_bytes_per_s = 0;  // > 0; 0 = unlimited (with latency 0: an in-process worker)
  bool in_process() const { return latency_ns == 0 && bandwidth_bytes_per_s == 0; }
  // Time on the wire for `bytes`, without the latency.
  int64_t serialization_ns(int64_t bytes) const;
};

// One direction of a link: FIFO, one message on the wire at a time.
class Channel {
 public:
  // Sends `bytes` at `now`; returns when the message has arrived.
  int64_t send(int64_t now, int64_t bytes, const NetworkLink& link);

 private:
  int64_t free_at_ = 0;  // the wire is busy until then
};

// Bytes of the frame that carries the plan (result) between head and node:
// transport::encode of the message plus ZeroMQ's 2- or 9-byte frame header.
int64_t plan_wire_bytes(const core::StepPlan& plan);
int64_t result_wire_bytes(const core::StepResult& result);

}  // namespace troupe::cluster::sim
