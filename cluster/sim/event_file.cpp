#include "cluster/sim/event_file.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>

#include "cluster/sim/yaml_reader.hpp"

namespace troupe::cluster::sim {
namespace {

constexpr double kMaxSeconds = 1e9;  // as parse_fault's

int64_t seconds(const YamlReader& r, const YAML::Node& n, const std::string& where) {
  const double v = r.number(n, where);
  if (v > kMaxSeconds) r.fail(where, "must be at most 1e9 seconds");
  return std::llround(v * 1e9);
}

}  // namespace

std::vector<EventEntry> load_events_file(const std::string& path, const MemoryParser& parse_memory) {
  YamlReader r(path);
  const YAML::Node root = r.load("events file");
  r.only(root, "top level", {"events"});
  const YAML::Node list = root["events"];
  if (!list || !list.IsSequence()) r.fail("events", "must be a list of events");
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::vector<EventEntry> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node& n = list[i];
    const std::string where = "events[" + std::to_string(i) + "]";
    r.only(n, where, {"at", "kill", "hang", "drain", "cut", "for", "add"});
    if (!n["at"]) r.fail(where, "needs 'at' (seconds of virtual time)");
    EventEntry e;
    e.fault.at_ns = seconds(r, n["at"], where + ".at");
    int kinds = 0;
    for (const auto& [key, kind] : {std::pair{"kill", FaultKind::kKill}, std::pair{"hang", FaultKind::kHang},
                                    std::pair{"drain", FaultKind::kDrain}, std::pair{"cut", FaultKind::kCut},
                                    std::pair{"add", FaultKind::kAdd}}) {
      if (!n[key]) continue;
      ++kinds;
      e.fault.kind = kind;
      if (kind != FaultKind::kAdd)
        e.fault.worker = static_cast<uint64_t>(
            r.integer(n[key], where + "." + key, 1, std::numeric_limits<uint32_t>::max()));
    }
    if (kinds != 1) r.fail(where, "needs exactly one of kill, hang, drain, cut, add");
    if (e.fault.kind == FaultKind::kCut) {
      if (!n["for"]) r.fail(where, "a cut needs 'for' (seconds the link is down)");
      e.fault.duration_ns = seconds(r, n["for"], where + ".for");
      if (e.fault.duration_ns <= 0) r.fail(where + ".for", "must be > 0");
    } else if (n["for"]) {
      r.fail(where, "'for' belongs to a cut");
    }
    if (e.fault.kind == FaultKind::kAdd) {
      const YAML::Node& a = n["add"];
      const std::string aw = where + ".add";
      if (a.IsMap() && a["node"]) {
        r.only(a, aw, {"node"});
        e.group = r.text(a["node"], aw + ".node");
      } else {
        std::set<std::string> keys = node_group_keys();
        keys.erase("count");
        keys.erase("workers");
        keys.insert("node");
        r.only(a, aw, keys);
        e.node = read_node_group(r, a, aw, dir, NetworkLink{}, parse_memory, "added-" + std::to_string(i));
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<SimFault> resolve_events(const std::vector<EventEntry>& entries, const ClusterSpec& spec,
                                     CostProfiles& profiles, const std::string& default_cost) {
  std::vector<SimFault> out;
  for (const EventEntry& e : entries) {
    SimFault f = e.fault;
    if (f.kind == FaultKind::kAdd) {
      NodeGroup g;
      if (e.node) {
        g = *e.node;
        if (g.cost.empty()) g.cost = default_cost;
      } else {
        std::string names;
        const NodeGroup* found = nullptr;
        for (const NodeGroup& x : spec.groups) {
          names += (names.empty() ? "" : ", ") + x.name;
          if (x.name == e.group && !found) found = &x;
        }
        if (!found)
          throw std::invalid_argument("events: add names node group '" + e.group + "'; the cluster has " +
                                      names);
        g = *found;
      }
      f.add = std::make_shared<const SimWorkerSpec>(build_worker(spec, g, profiles));
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace troupe::cluster::sim
