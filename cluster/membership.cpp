#include "cluster/membership.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>

namespace troupe::cluster {
namespace {

// Whether `reg` is the register a node already made: its name and every
// worker's report alike.
bool same_node(const std::string& name, const std::vector<transport::WorkerInfo>& infos,
               const transport::Register& reg) {
  auto fields = [](const transport::WorkerInfo& w) {
    return std::tie(w.index, w.device, w.num_blocks, w.block_size, w.max_model_len, w.vocab_size, w.threads,
                    w.fingerprint, w.dtype, w.kv_dtype);
  };
  return name == reg.node && std::equal(infos.begin(), infos.end(), reg.workers.begin(), reg.workers.end(),
                                        [&](const auto& a, const auto& b) { return fields(a) == fields(b); });
}

// Bytes of one KV value stored as `kv_dtype`; 0 for a name this head does not know.
int64_t kv_value_bytes(const std::string& kv_dtype) {
  if (kv_dtype == "float32") return 4;
  if (kv_dtype == "bfloat16") return 2;
  return 0;
}

}  // namespace

Membership::Membership(const MembershipOptions& options, uint64_t first_worker_id)
    : options_(options), next_worker_id_(first_worker_id) {
  if (first_worker_id == 0) throw std::invalid_argument("Membership: worker id 0 is reserved");
  transport::Liveness check(options.liveness, transport::Clock::now());  // validates the options
  (void)check;
}

std::variant<Membership::Joined, Membership::Refusal> Membership::on_register(
    const std::string& peer, const transport::Register& reg, transport::Clock::time_point now) {
  // `why` goes to the node; `detail` (default: the same) only to the head's log.
  auto refuse = [](std::string why, std::string detail = {}) {
    if (detail.empty()) detail = why;
    return Refusal{transport::Refused{std::move(why)}, std::move(detail)};
  };
  if (reg.workers.empty()) return refuse("a node must bring at least one worker");
  if (reg.workers.size() > options_.max_workers_per_node) {
    return refuse("a node may bring at most " + std::to_string(options_.max_workers_per_node) + " workers");
  }
  if (!nodes_.count(peer) && nodes_.size() >= options_.max_nodes) {
    return refuse("the head takes no more nodes (it has " + std::to_string(nodes_.size()) + ", --max-nodes " +
                  std::to_string(options_.max_nodes) + ")");
  }
  std::map<uint32_t, bool> seen;
  for (const auto& w : reg.workers) {
    const std::string who = "worker " + std::to_string(w.index) + " of node '" + reg.node + "': ";
    if (!seen.emplace(w.index, true).second) return refuse(who + "index given twice");
    const bool same_model = (options_.fingerprint == 0 || w.fingerprint == options_.fingerprint) &&
                            (options_.vocab_size == 0 || w.vocab_size == options_.vocab_size);
    if (!same_model) {
      return refuse(who + "serves another model than the head (load the head's model folder)",
                    who + "serves another model (fingerprint " + std::to_string(w.fingerprint) +
                        ", vocabulary " + std::to_string(w.vocab_size) + "; the head's are " +
                        std::to_string(options_.fingerprint) + ", " + std::to_string(options_.vocab_size) +
                        ")");
    }
    if (w.dtype != options_.dtype && !options_.allow_mixed_dtypes) {
      return refuse(who + "runs --dtype " + w.dtype + ", the head " + options_.dtype +
                    " (a request's tokens would depend on where it runs; --allow-mixed-dtypes on the head "
                    "accepts it)");
    }
    if (kv_value_bytes(w.kv_dtype) == 0) return refuse(who + "reports an unknown KV dtype '" + w.kv_dtype + "'");
    if (w.kv_dtype != options_.kv_dtype && !options_.allow_mixed_dtypes) {
      return refuse(who + "runs --kv-cache-dtype " + w.kv_dtype + ", the head " + options_.kv_dtype +
                    " (a request's tokens would depend on where it runs; --allow-mixed-dtypes on the head "
                    "accepts it)");
    }
    if (w.num_blocks < 1 || w.block_size < 1 || w.max_model_len < 2) {
      return refuse(who + "reports an unusable KV pool or model length");
    }
    if (w.num_blocks > options_.max_worker_blocks) {
      return refuse(who + "reports " + std::to_string(w.num_blocks) + " KV blocks; the head takes at most " +
                    std::to_string(options_.max_worker_blocks) + " per worker");
    }
    if (options_.kv_values_per_token > 0) {
      const int64_t needs =
          int64_t{w.num_blocks} * w.block_size * options_.kv_values_per_token * kv_value_bytes(w.kv_dtype);
      if (w.kv_bytes <= 0 || w.kv_bytes > options_.max_worker_kv_bytes || needs > w.kv_bytes) {
        return refuse(who + "reports " + std::to_string(w.num_blocks) + " KV blocks of " +
                      std::to_string(w.block_size) + " tokens, which need " + std::to_string(needs) +
                      " bytes, and declares " + std::to_string(w.kv_bytes) + " bytes of KV memory (at most " +
                      std::to_string(options_.max_worker_kv_bytes) + " per worker)");
      }
    }
  }
  Joined joined;
  if (auto it = nodes_.find(peer); it != nodes_.end()) {
    if (same_node(it->second.name, it->second.infos, reg)) {
      it->second.liveness.on_message(now);
      joined.reply = reply_for(it->second);
      joined.again = true;
      return joined;
    }
    for (const auto& [index, id] : it->second.workers) {
      joined.replaced.push_back(id);
      where_.erase(id);
    }
    nodes_.erase(it);
  }
  Node node{reg.node, {}, transport::Liveness(options_.liveness, now), false, reg.workers};
  for (const auto& w : reg.workers) {
    const uint64_t id = next_worker_id_++;
    node.workers[w.index] = id;
    where_[id] = {peer, w.index};
    joined.workers.push_back({id, reg.node, w});
  }
  joined.reply = reply_for(node);
  nodes_.emplace(peer, std::move(node));
  return joined;
}

transport::Registered Membership::reply_for(const Node& node) const {
  transport::Registered reply;
  for (const auto& [index, id] : node.workers) reply.workers.push_back({index, static_cast<uint32_t>(id)});
  reply.heartbeat_ms = static_cast<int32_t>(options_.liveness.heartbeat_interval.count());
  reply.liveness = options_.liveness.liveness;
  return reply;
}

bool Membership::on_message(const std::string& peer, transport::Clock::time_point now) {
  auto it = nodes_.find(peer);
  if (it == nodes_.end()) return false;
  it->second.liveness.on_message(now);
  return true;
}

void Membership::on_sent(const std::string& peer, transport::Clock::time_point now) {
  if (auto it = nodes_.find(peer); it != nodes_.end()) it->second.liveness.on_sent(now);
}

std::string Membership::node_name(const std::string& peer) const {
  auto it = nodes_.find(peer);
  return it == nodes_.end() ? std::string() : it->second.name;
}

std::vector<uint64_t> Membership::forget_node(const std::string& peer) {
  std::vector<uint64_t> ids;
  auto it = nodes_.find(peer);
  if (it == nodes_.end()) return ids;
  for (const auto& [index, id] : it->second.workers) {
    ids.push_back(id);
    where_.erase(id);
  }
  nodes_.erase(it);
  return ids;
}

std::vector<uint64_t> Membership::take_lost(transport::Clock::time_point now) {
  std::vector<std::string> silent;
  for (const auto& [peer, node] : nodes_)
    if (node.liveness.lost(now)) silent.push_back(peer);
  std::vector<uint64_t> lost;
  for (const std::string& peer : silent) {
    const auto ids = forget_node(peer);
    lost.insert(lost.end(), ids.begin(), ids.end());
  }
  return lost;
}

std::vector<std::string> Membership::heartbeats_due(transport::Clock::time_point now) {
  std::vector<std::string> due;
  for (auto& [peer, node] : nodes_) {
    if (!node.liveness.due_heartbeat(now)) continue;
    node.liveness.on_sent(now);
    due.push_back(peer);
  }
  return due;
}

std::vector<uint64_t> Membership::drain(const std::string& peer) {
  std::vector<uint64_t> ids;
  auto it = nodes_.find(peer);
  if (it == nodes_.end()) return ids;
  it->second.draining = true;
  for (const auto& [index, id] : it->second.workers) ids.push_back(id);
  return ids;
}

std::optional<std::string> Membership::forget_worker(uint64_t worker_id) {
  auto w = where_.find(worker_id);
  if (w == where_.end()) return std::nullopt;
  const auto [peer, index] = w->second;
  where_.erase(w);
  auto it = nodes_.find(peer);
  if (it == nodes_.end()) return std::nullopt;
  it->second.workers.erase(index);
  if (!it->second.workers.empty()) return std::nullopt;
  nodes_.erase(it);
  return peer;
}

std::optional<std::pair<std::string, uint32_t>> Membership::address(uint64_t worker_id) const {
  auto it = where_.find(worker_id);
  if (it == where_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint64_t> Membership::worker_id(const std::string& peer, uint32_t index) const {
  auto it = nodes_.find(peer);
  if (it == nodes_.end()) return std::nullopt;
  auto w = it->second.workers.find(index);
  if (w == it->second.workers.end()) return std::nullopt;
  return w->second;
}

}  // namespace troupe::cluster
