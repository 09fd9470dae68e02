#include "cluster/sim/network.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::cluster::sim {
namespace {

// msgpack widths, roughly: a small map/array header and integers up to 9 bytes.
constexpr int64_t kHeader = 24;    // frame, protocol id and version, message type, step id
constexpr int64_t kId = 9;         // uint64
constexpr int64_t kInt = 5;        // int32 (token ids, positions, block numbers)
constexpr int64_t kSampling = 32;  // temperature, top_k, top_p, seed, logprobs

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

int64_t estimate_plan_bytes(const core::StepPlan& plan) {
  int64_t n = kHeader + kId * static_cast<int64_t>(plan.drop.size());
  for (const auto& s : plan.new_seqs) {
    n += kId + kInt + kSampling + kInt * static_cast<int64_t>(s.tokens.size() + s.block_table.size());
  }
  for (const auto& w : plan.work) n += kId + 2 * kInt + 1 + kInt * static_cast<int64_t>(w.new_blocks.size());
  return n;
}

int64_t estimate_result_bytes(const core::StepResult& r) {
  int64_t n = kHeader + 16 + static_cast<int64_t>(r.error.size());  // + timings
  for (const auto& o : r.outputs) n += kId + kInt + 5 + 10 * static_cast<int64_t>(o.token.top.size());
  for (const auto& f : r.failures) n += kId + 1 + static_cast<int64_t>(f.error.size());
  return n;
}

}  // namespace troupe::cluster::sim
