#pragma once
// The events file of `troupe simulate --events`: faults and membership
// changes at fixed virtual times (read with yaml-cpp; JSON is YAML too):
//
//   events:
//     - {at: 30, kill: 3}              # worker 3's process killed (SIGKILL) at 30 s
//     - {at: 40, hang: 2}              # worker 2's steps stop finishing
//     - {at: 50, drain: 1}             # worker 1 drained (SIGTERM)
//     - {at: 60, add: {node: gpu}}     # one more worker like those of the cluster file's group 'gpu'
//     - {at: 65, add: {cost: cost.json, kv_blocks: 4000, network: {latency_us: 50}}}  # or described here
//     - {at: 70, cut: 4, for: 2.5}     # the link between the head and worker 4 down for 2.5 s
//
// `at` and `for` are seconds (`at` >= 0, `for` > 0). Each entry holds `at`
// and exactly one of kill, hang, drain, cut (a worker id: those of the
// cluster, then those that join, in the order they join), add. An `add`
// describes one worker: `node: NAME` (a group of the cluster file; with
// --workers, "worker"), or a node group's keys but count and workers (name,
// cost, cost_scale, kv_blocks | kv_memory, local, network; the cost relative
// to this file, absent = --cost; no network = no delay). Unknown keys are
// errors naming the entry ("events[3].add: unknown key ...").
#include <optional>
#include <string>
#include <vector>

#include "cluster/sim/cluster_spec.hpp"
#include "cluster/sim/simulator.hpp"

namespace troupe::cluster::sim {

// One entry, its add not yet resolved against the cluster.
struct EventEntry {
  SimFault fault;                 // kind, worker, at_ns, duration_ns (an add's `add` unset)
  std::string group;              // add: {node: NAME}
  std::optional<NodeGroup> node;  // add: a node described in place (one worker)
};

// Throws std::runtime_error naming the file, the entry and the key on
// anything invalid.
std::vector<EventEntry> load_events_file(const std::string& path, const MemoryParser& parse_memory);

// The entries as SimOptions::faults takes them: each add's worker built as
// the cluster's own (build_worker), from the group it names or its own
// (whose cost, when it names none, is `default_cost`). Throws
// std::invalid_argument for an unknown group or a worker the cluster cannot take.
std::vector<SimFault> resolve_events(const std::vector<EventEntry>& entries, const ClusterSpec& spec,
                                     CostProfiles& profiles, const std::string& default_cost);

}  // namespace troupe::cluster::sim
