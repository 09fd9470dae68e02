#pragma once
// Membership: the head's record of worker nodes (processes, possibly on other
// hosts) and their workers. Decisions only, no sockets or threads: the
// head's gateway actor feeds it what arrives and the time, and sends what it
// returns.
//
// A node's life:
//
//   register ──(fingerprint and shape agree)──▶ MEMBER ──drain──▶ DRAINING ──all drained──▶ shutdown sent,
//   GONE
//      │                                          │  ▲ any message = a beat                       ▲
//      └──(disagree)──▶ refused                   └──┴──── silent for `liveness` intervals ───────┴─▶ LOST
//
// Worker ids are cluster-wide and never reused (a node that comes back after
// being lost registers anew and gets new ids), so a late result from a lost
// worker can never be taken for a new one's.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "transport/liveness.hpp"
#include "transport/protocol.hpp"

namespace troupe::cluster {

struct MembershipOptions {
  transport::LivenessOptions liveness;  // heartbeat interval and liveness, told to every node
  uint64_t fingerprint = 0;             // the head's model; a node with another is refused
  std::string dtype = "float32";        // the head's --dtype; a worker with another is refused unless
  std::string kv_dtype = "float32";     // (or its --kv-cache-dtype: the same for another KV storage)
  bool allow_mixed_dtypes = false;      // this (--allow-mixed-dtypes)
  int32_t vocab_size = 0;               // the head's model (a cheap second check)
  uint32_t max_workers_per_node = 64;   // more in one register is refused
  uint32_t max_nodes = 64;              // nodes at once (--max-nodes); another is refused
  // Values in one token slot of the head's model (all layers, K and V); 0 =
  // no check. A worker must declare the memory its pool takes
  // (WorkerInfo::kv_bytes), and num_blocks x block_size x this x the bytes
  // of its kv_dtype must fit it: the head keeps per-block state for every
  // block a node reports.
  int64_t kv_values_per_token = 0;
  int64_t max_worker_kv_bytes = int64_t{1} << 40;  // declared KV memory of one worker at most (1 TiB)
  int32_t max_worker_blocks = 1 << 21;             // KV blocks of one worker at most
};

// A worker a node brought: its cluster id and what it reported.
struct JoinedWorker {
  uint64_t worker_id = 0;
  std::string node;  // the node's name
  transport::WorkerInfo info;
};

class Membership {
 public:
  // `first_worker_id`: ids given out start here (local workers take the ones before).
  Membership(const MembershipOptions& options, uint64_t first_worker_id);

  // A node (`peer` = its socket identity) registers. Returns the workers to
  // add to the batcher and the reply to send, or the reason to refuse it.
  // A peer that registers again with other workers replaces its old record:
  // `replaced` lists the old workers' ids (the batcher must drop them). The
  // same register again from the same peer is a retransmission (the node
  // sends it until a reply arrives, and ZeroMQ delivers what it queued while
  // the head was away all at once): `again`, the same reply, nothing added
  // or replaced. A node that really starts over (it lost the head) comes
  // back on a new socket, under another peer identity.
  struct Joined {
    std::vector<JoinedWorker> workers;
    transport::Registered reply;
    std::vector<uint64_t> replaced;
    bool again = false;
  };
  // A refusal: the reply tells the node what it can fix and nothing about the
  // head's model (a stranger learns nothing); `detail` is for the head's log.
  struct Refusal {
    transport::Refused reply;
    std::string detail;
  };
  std::variant<Joined, Refusal> on_register(const std::string& peer, const transport::Register& reg,
                                            transport::Clock::time_point now);
  // Anything from `peer` counts as a beat. False for a peer that is not a member.
  bool on_message(const std::string& peer, transport::Clock::time_point now);
  // A frame went to `peer`: its next heartbeat can wait.
  void on_sent(const std::string& peer, transport::Clock::time_point now);

  // Members silent for too long, forgotten now: their workers' ids.
  std::vector<uint64_t> take_lost(transport::Clock::time_point now);
  // Members owed a heartbeat now (counted as sent).
  std::vector<std::string> heartbeats_due(transport::Clock::time_point now);

  // The node asked to leave: its workers, to drain.
  std::vector<uint64_t> drain(const std::string& peer);
  // The batcher let go of a worker (drained, or broken): forget it. When it
  // was its node's last, the node is forgotten too and its peer returned
  // (send it `shutdown`).
  std::optional<std::string> forget_worker(uint64_t worker_id);

  // Where a worker lives: (peer, index on its node).
  std::optional<std::pair<std::string, uint32_t>> address(uint64_t worker_id) const;
  // The cluster id of a node's worker.
  std::optional<uint64_t> worker_id(const std::string& peer, uint32_t index) const;
  size_t num_nodes() const { return nodes_.size(); }
  // The peer of a member node, by name of its socket identity; whether it is one.
  bool is_member(const std::string& peer) const { return nodes_.count(peer) != 0; }
  // Forgets a node and returns its workers' ids (the head let it go: reset).
  std::vector<uint64_t> forget_node(const std::string& peer);
  // The name a member node registered with ("" for an unknown peer).
  std::string node_name(const std::string& peer) const;
  // A fresh worker id, never given before (a local worker restarted).
  uint64_t take_worker_id() { return next_worker_id_++; }

 private:
  struct Node {
    std::string name;
    std::map<uint32_t, uint64_t> workers;  // index -> worker id
    transport::Liveness liveness;
    bool draining = false;
    std::vector<transport::WorkerInfo> infos;  // as registered
  };
  transport::Registered reply_for(const Node& node) const;
  MembershipOptions options_;
  uint64_t next_worker_id_;
  std::map<std::string, Node> nodes_;                           // by peer
  std::map<uint64_t, std::pair<std::string, uint32_t>> where_;  // worker id -> (peer, index)
};

}  // namespace troupe::cluster
