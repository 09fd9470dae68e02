#pragma once
// ClusterSpec: the cluster a simulation runs, from flags or one YAML file
// (read with yaml-cpp; JSON is YAML too):
//
//   placement: prefix-affinity        # round-robin | least-loaded | prefix-affinity
//   scheduler:                        # troupe batch's settings, for every worker
//     max_num_seqs: 256
//     max_batched_tokens: 2048
//     block_size: 16                  # must equal the cost profile's
//     prefix_caching: true
//     chunked_prefill: true
//     max_steps_in_flight: 2
//   network:                          # default link of remote nodes
//     latency_us: 50
//     bandwidth_gbps: 10              # gigabits per second
//   nodes:
//     - name: head                    # in the head's process: no network
//       local: true
//       workers: 1                    # workers per node
//       cost: cost-cpu.json           # relative to this file; absent = --cost
//       kv_memory: 2GiB               # or kv_blocks: 4096
//     - name: gpu
//       count: 4                      # nodes of this kind
//       workers: 2
//       cost: cost-h200.json
//       cost_scale: 0.8               # every step time x 0.8 (a faster one of the kind); default 1
//       kv_blocks: 60000
//       network: {latency_us: 20}     # overrides the default
//
// Workers get ids in file order (node group, node, worker). Unknown keys are
// errors (a typo must not be silently ignored).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cluster/sim/cost_profile.hpp"
#include "cluster/sim/network.hpp"
#include "cluster/sim/simulator.hpp"
#include "core/batcher.hpp"

namespace troupe::cluster::sim {

struct SchedulerSettings {
  int32_t max_num_seqs = 256;         // running sequences per worker; >= 1
  int32_t max_batched_tokens = 2048;  // tokens per step; >= 1
  int32_t block_size = 16;            // KV block size; must match the cost profiles'
  bool prefix_caching = true;
  bool chunked_prefill = true;
  int32_t max_steps_in_flight = 2;  // per worker; [1, 8]
};

struct NodeGroup {
  std::string name;
  int32_t count = 1;      // nodes of this kind; >= 1
  int32_t workers = 1;    // workers per node; >= 1
  std::string cost;       // cost profile path; empty = the caller's default (--cost)
  double cost_scale = 1;  // every predicted step time of these workers x this (finite, > 0)
  int32_t kv_blocks = 0;  // KV blocks per worker; 0 = from kv_memory
  int64_t kv_memory = 0;  // KV bytes per worker; 0 = 2 GiB (troupe serve's default)
  bool local = false;     // in the head's process: no network delay
  NetworkLink link;       // when not local
};

struct ClusterSpec {
  core::PlacementPolicy placement = core::PlacementPolicy::kPrefixAffinity;
  SchedulerSettings scheduler;
  std::vector<NodeGroup> groups;
};

// "2GiB", "512MiB", "1.5G", "100000" -> bytes; the caller's parser (troupe's
// own lives with the engine). Throws std::invalid_argument on junk.
using MemoryParser = std::function<int64_t(const std::string&)>;

// Reads a cluster file. Cost paths are made relative to the file's folder.
// Throws std::runtime_error naming the file and the key on anything invalid.
ClusterSpec load_cluster_file(const std::string& path, const MemoryParser& parse_memory);

// Loads each distinct cost profile once. model(path, scale) is the profile's
// cost model times `cost_scale` x `scale` (each finite, > 0;
// CostModel::scaled), built once per pair; get() is the profile as read.
class CostProfiles {
 public:
  explicit CostProfiles(double cost_scale = 1);
  const CostProfile& get(const std::string& path);
  std::shared_ptr<const CostModel> model(const std::string& path, double scale = 1);

 private:
  double cost_scale_;
  std::map<std::string, std::shared_ptr<CostProfile>> profiles_;
  std::map<std::pair<std::string, double>, std::shared_ptr<const CostModel>> models_;
};

// The workers of a spec, ready for SimOptions::workers. Checks that every
// profile's block size equals the scheduler's and that all serve one model.
// Throws std::invalid_argument saying what disagrees.
std::vector<SimWorkerSpec> build_workers(const ClusterSpec& spec, CostProfiles& profiles);
// One worker of group `g` (its node named after the group), as build_workers
// makes each of a spec's own; `g` need not be one of the spec's groups (a
// worker that joins later: an events file's `add`).
SimWorkerSpec build_worker(const ClusterSpec& spec, const NodeGroup& g, CostProfiles& profiles);

// What every request is checked against: the smallest max_model_len and the
// model's vocabulary (from the first group's profile).
ModelShape cluster_model(const ClusterSpec& spec, CostProfiles& profiles);

// The same spec with the last group's node count set to `count` (>= 1): how
// --find-workers grows a cluster.
ClusterSpec with_last_group_nodes(ClusterSpec spec, int32_t count);
int32_t total_workers(const ClusterSpec& spec);

}  // namespace troupe::cluster::sim
