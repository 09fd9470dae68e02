#include "cluster/sim/cluster_spec.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <stdexcept>

#include "cluster/sim/yaml_reader.hpp"

namespace troupe::cluster::sim {
namespace {

constexpr int64_t kDefaultKvMemory = int64_t{2} << 30;  // troupe serve's --kv-memory default

void check_groups(const ClusterSpec& spec) {
  if (spec.groups.empty()) throw std::invalid_argument("the cluster has no nodes");
  for (const NodeGroup& g : spec.groups)
    if (g.cost.empty())
      throw std::invalid_argument("node group '" + g.name +
                                  "' has no cost profile: give its 'cost' or --cost");
}

}  // namespace

ClusterSpec load_cluster_file(const std::string& path, const MemoryParser& parse_memory) {
  YamlReader r(path);
  const YAML::Node root = r.load("cluster file");
  ClusterSpec spec;
  r.only(root, "top level", {"placement", "scheduler", "network", "nodes"});
  if (root["placement"]) {
    try {
      spec.placement = core::parse_placement(r.text(root["placement"], "placement"));
    } catch (const std::invalid_argument& e) {
      r.fail("placement", e.what());
    }
  }
  if (const auto s = root["scheduler"]) {
    r.only(s, "scheduler",
           {"max_num_seqs", "max_batched_tokens", "block_size", "prefix_caching", "chunked_prefill",
            "max_steps_in_flight"});
    constexpr int64_t big = std::numeric_limits<int32_t>::max();
    SchedulerSettings& o = spec.scheduler;
    if (s["max_num_seqs"])
      o.max_num_seqs = static_cast<int32_t>(r.integer(s["max_num_seqs"], "scheduler.max_num_seqs", 1, big));
    if (s["max_batched_tokens"])
      o.max_batched_tokens =
          static_cast<int32_t>(r.integer(s["max_batched_tokens"], "scheduler.max_batched_tokens", 1, big));
    if (s["block_size"])
      o.block_size = static_cast<int32_t>(r.integer(s["block_size"], "scheduler.block_size", 1, 1024));
    if (s["prefix_caching"]) o.prefix_caching = r.boolean(s["prefix_caching"], "scheduler.prefix_caching");
    if (s["chunked_prefill"])
      o.chunked_prefill = r.boolean(s["chunked_prefill"], "scheduler.chunked_prefill");
    if (s["max_steps_in_flight"])
      o.max_steps_in_flight =
          static_cast<int32_t>(r.integer(s["max_steps_in_flight"], "scheduler.max_steps_in_flight", 1, 8));
  }
  NetworkLink base;
  if (root["network"]) base = r.link(root["network"], "network", base);
  const auto nodes = root["nodes"];
  if (!nodes || !nodes.IsSequence() || nodes.size() == 0)
    r.fail("nodes", "must be a non-empty list of node groups");
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    const std::string where = "nodes[" + std::to_string(i) + "]";
    r.only(n, where, node_group_keys());
    spec.groups.push_back(read_node_group(r, n, where, dir, base, parse_memory, "node" + std::to_string(i)));
  }
  return spec;
}

CostProfiles::CostProfiles(double cost_scale) : cost_scale_(cost_scale) {
  if (!std::isfinite(cost_scale) || !(cost_scale > 0))
    throw std::invalid_argument("the cost scale must be finite and > 0, got " + std::to_string(cost_scale));
}

const CostProfile& CostProfiles::get(const std::string& path) {
  auto& p = profiles_[path];
  if (!p) p = std::make_shared<CostProfile>(read_cost_profile(path));
  return *p;
}

std::shared_ptr<const CostModel> CostProfiles::model(const std::string& path, double scale) {
  auto& m = models_[{path, scale}];
  if (!m) {
    const double f = cost_scale_ * scale;  // scaled() refuses a bad one
    m = std::make_shared<const CostModel>(f == 1 ? get(path).cost : get(path).cost.scaled(f));
  }
  return m;
}

ModelShape cluster_model(const ClusterSpec& spec, CostProfiles& profiles) {
  check_groups(spec);
  ModelShape m = profiles.get(spec.groups[0].cost).model;
  for (const auto& g : spec.groups)
    m.n_positions = std::min(m.n_positions, profiles.get(g.cost).model.n_positions);
  return m;
}

SimWorkerSpec build_worker(const ClusterSpec& spec, const NodeGroup& g, CostProfiles& profiles) {
  check_groups(spec);
  if (g.cost.empty())
    throw std::invalid_argument("node group '" + g.name + "' has no cost profile: give its 'cost' or --cost");
  const ModelShape first = profiles.get(spec.groups[0].cost).model;
  const CostProfile& p = profiles.get(g.cost);
  if (p.block_size != spec.scheduler.block_size) {
    throw std::invalid_argument("cost profile '" + g.cost + "' was measured with block size " +
                                std::to_string(p.block_size) + ", the scheduler uses " +
                                std::to_string(spec.scheduler.block_size) + "; profile again or change it");
  }
  if (p.model.vocab_size != first.vocab_size || p.model.eos_token_id != first.eos_token_id)
    throw std::invalid_argument("cost profile '" + g.cost + "' was measured on another model than '" +
                                spec.groups[0].cost + "'");
  core::SchedulerOptions so;
  so.block_size = spec.scheduler.block_size;
  if (g.kv_blocks > 0) {
    so.num_blocks = g.kv_blocks;
  } else {
    const int64_t bytes = g.kv_memory > 0 ? g.kv_memory : kDefaultKvMemory;
    const int64_t blocks = bytes / (p.kv_bytes_per_token * so.block_size);
    if (blocks < 1)
      throw std::invalid_argument("node group '" + g.name + "': its KV memory holds not one block");
    so.num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max()));
  }
  so.max_num_seqs = spec.scheduler.max_num_seqs;
  so.max_num_batched_tokens = spec.scheduler.max_batched_tokens;
  so.max_model_len = p.model.n_positions;
  so.vocab_size = p.model.vocab_size;
  so.eos_id = p.model.eos_token_id;
  so.enable_prefix_caching = spec.scheduler.prefix_caching;
  so.enable_chunked_prefill = spec.scheduler.chunked_prefill;
  so.max_steps_in_flight = spec.scheduler.max_steps_in_flight;
  SimWorkerSpec w;
  w.node = g.name;
  w.device = p.device;
  w.cost = profiles.model(g.cost, g.cost_scale);
  w.scheduler = so;
  w.link = g.link;
  return w;
}

std::vector<SimWorkerSpec> build_workers(const ClusterSpec& spec, CostProfiles& profiles) {
  check_groups(spec);
  std::vector<SimWorkerSpec> out;
  for (const NodeGroup& g : spec.groups) {
    const SimWorkerSpec one = build_worker(spec, g, profiles);
    for (int32_t node = 0; node < g.count; ++node) {
      for (int32_t k = 0; k < g.workers; ++k) {
        out.push_back(one);
        if (g.count > 1) out.back().node = g.name + "-" + std::to_string(node);
      }
    }
  }
  return out;
}

ClusterSpec with_last_group_nodes(ClusterSpec spec, int32_t count) {
  if (spec.groups.empty()) throw std::invalid_argument("the cluster has no nodes");
  if (count < 1) throw std::invalid_argument("a node group needs at least one node");
  spec.groups.back().count = count;
  return spec;
}

int32_t total_workers(const ClusterSpec& spec) {
  int32_t n = 0;
  for (const auto& g : spec.groups) n += g.count * g.workers;
  return n;
}

}  // namespace troupe::cluster::sim
