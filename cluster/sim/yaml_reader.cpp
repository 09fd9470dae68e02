#include "cluster/sim/yaml_reader.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace troupe::cluster::sim {

YAML::Node YamlReader::load(const std::string& what) const {
  try {
    return YAML::LoadFile(path_);
  } catch (const YAML::BadFile&) {
    throw std::runtime_error("cannot read " + what + " '" + path_ + "'");
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(path_ + ": not valid YAML: " + e.what());
  }
}

void YamlReader::fail(const std::string& where, const std::string& what) const {
  throw std::runtime_error(path_ + ": " + where + ": " + what);
}

void YamlReader::only(const YAML::Node& map, const std::string& where,
                      const std::set<std::string>& keys) const {
  if (!map.IsMap()) fail(where, "must be a mapping");
  for (const auto& kv : map) {
    const auto key = kv.first.as<std::string>();
    if (!keys.count(key)) {
      std::string known;
      for (const auto& k : keys) known += (known.empty() ? "" : ", ") + k;
      fail(where, "unknown key '" + key + "' (known: " + known + ")");
    }
  }
}

int64_t YamlReader::integer(const YAML::Node& n, const std::string& where, int64_t lo, int64_t hi) const {
  int64_t v = 0;
  try {
    v = n.as<int64_t>();
  } catch (const YAML::Exception&) {
    fail(where, "must be an integer");
  }
  if (v < lo || v > hi) fail(where, "must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

double YamlReader::number(const YAML::Node& n, const std::string& where) const {
  double v = 0;
  try {
    v = n.as<double>();
  } catch (const YAML::Exception&) {
    fail(where, "must be a number");
  }
  if (!std::isfinite(v) || v < 0) fail(where, "must be a non-negative number");
  return v;
}

bool YamlReader::boolean(const YAML::Node& n, const std::string& where) const {
  try {
    return n.as<bool>();
  } catch (const YAML::Exception&) {
    fail(where, "must be true or false");
  }
}

std::string YamlReader::text(const YAML::Node& n, const std::string& where) const {
  if (!n.IsScalar()) fail(where, "must be a string");
  return n.as<std::string>();
}

NetworkLink YamlReader::link(const YAML::Node& n, const std::string& where, NetworkLink base) const {
  only(n, where, {"latency_us", "bandwidth_gbps"});
  if (n["latency_us"]) base.latency_ns = std::llround(number(n["latency_us"], where + ".latency_us") * 1e3);
  if (n["bandwidth_gbps"]) {
    const double g = number(n["bandwidth_gbps"], where + ".bandwidth_gbps");
    if (g == 0) fail(where + ".bandwidth_gbps", "must be > 0 (leave it out for no bandwidth limit)");
    base.bandwidth_bytes_per_s = g * 1e9 / 8;
  }
  return base;
}

const std::set<std::string>& node_group_keys() {
  static const std::set<std::string> keys = {"name",      "count",     "workers", "cost",   "cost_scale",
                                             "kv_blocks", "kv_memory", "local",   "network"};
  return keys;
}

NodeGroup read_node_group(const YamlReader& r, const YAML::Node& n, const std::string& where,
                          const std::filesystem::path& dir, const NetworkLink& base,
                          const MemoryParser& parse_memory, const std::string& default_name) {
  NodeGroup g;
  g.name = n["name"] ? r.text(n["name"], where + ".name") : default_name;
  if (n["count"]) g.count = static_cast<int32_t>(r.integer(n["count"], where + ".count", 1, 1'000'000));
  if (n["workers"]) g.workers = static_cast<int32_t>(r.integer(n["workers"], where + ".workers", 1, 1024));
  if (n["cost"]) {
    const std::filesystem::path cost = r.text(n["cost"], where + ".cost");
    g.cost = cost.is_absolute() || dir.empty() ? cost.string() : (dir / cost).string();
  }
  if (n["cost_scale"]) {
    g.cost_scale = r.number(n["cost_scale"], where + ".cost_scale");
    if (!(g.cost_scale > 0)) r.fail(where + ".cost_scale", "must be > 0");
  }
  if (n["kv_blocks"] && n["kv_memory"]) r.fail(where, "give kv_blocks or kv_memory, not both");
  if (n["kv_blocks"])
    g.kv_blocks = static_cast<int32_t>(
        r.integer(n["kv_blocks"], where + ".kv_blocks", 1, std::numeric_limits<int32_t>::max()));
  if (n["kv_memory"]) {
    try {
      g.kv_memory = parse_memory(r.text(n["kv_memory"], where + ".kv_memory"));
    } catch (const std::invalid_argument& e) {
      r.fail(where + ".kv_memory", e.what());
    }
  }
  if (n["local"]) g.local = r.boolean(n["local"], where + ".local");
  if (n["network"] && g.local) r.fail(where, "a local node has no network");
  g.link = g.local ? NetworkLink{} : (n["network"] ? r.link(n["network"], where + ".network", base) : base);
  return g;
}

}  // namespace troupe::cluster::sim
