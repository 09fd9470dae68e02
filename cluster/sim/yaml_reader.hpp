#pragma once
// YamlReader: strict reading of the simulator's YAML files (the cluster
// file, the events file) with yaml-cpp. Every error names the file and the
// key path ("events[2].add.kv_blocks") and throws std::runtime_error;
// unknown keys are errors (a typo must not be silently ignored).
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>

#include <yaml-cpp/yaml.h>

#include "cluster/sim/cluster_spec.hpp"
#include "cluster/sim/network.hpp"

namespace troupe::cluster::sim {

class YamlReader {
 public:
  explicit YamlReader(std::string path) : path_(std::move(path)) {}
  // The file's document; std::runtime_error when it cannot be read or parsed
  // (`what` names the file's kind: "cluster file").
  YAML::Node load(const std::string& what) const;
  [[noreturn]] void fail(const std::string& where, const std::string& what) const;
  // `map` is a mapping whose keys are all in `keys`.
  void only(const YAML::Node& map, const std::string& where, const std::set<std::string>& keys) const;
  int64_t integer(const YAML::Node& n, const std::string& where, int64_t lo, int64_t hi) const;
  double number(const YAML::Node& n, const std::string& where) const;  // finite, >= 0
  bool boolean(const YAML::Node& n, const std::string& where) const;
  std::string text(const YAML::Node& n, const std::string& where) const;
  // A `network` mapping (latency_us, bandwidth_gbps) over `base`.
  NetworkLink link(const YAML::Node& n, const std::string& where, NetworkLink base) const;

 private:
  std::string path_;
};

// The keys of a node group's mapping (the cluster file's `nodes` entries).
const std::set<std::string>& node_group_keys();

// One node group (name, count, workers, cost, cost_scale, kv_blocks |
// kv_memory, local, network), the keys checked by the caller; its cost path
// made relative to `dir`; an absent name is `default_name`, an absent
// network `base`.
NodeGroup read_node_group(const YamlReader& r, const YAML::Node& n, const std::string& where,
                          const std::filesystem::path& dir, const NetworkLink& base,
                          const MemoryParser& parse_memory, const std::string& default_name);

}  // namespace troupe::cluster::sim
