// Events files: every kind read, adds resolved against the cluster, and
// every mistake refused with the file, the entry's index and the key named.
#include "cluster/sim/event_file.hpp"

#include <gtest/gtest.h>

#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

using test::parse_memory;
using test::small_profile;

TEST(EventFile, ReadsEveryKind) {
  test::TempFile y(
      "events:\n"
      "  - {at: 30, kill: 3}\n"
      "  - {at: 40, hang: 2}\n"
      "  - {at: 50.5, drain: 1}\n"
      "  - {at: 60, add: {node: gpu}}\n"
      "  - {at: 65, add: {name: spare, cost: c.json, kv_blocks: 4000, network: {latency_us: 50}}}\n"
      "  - {at: 70, cut: 4, for: 2.5}\n",
      ".yaml");
  const auto e = load_events_file(y.path, parse_memory);
  ASSERT_EQ(e.size(), 6u);
  EXPECT_EQ(e[0].fault.kind, FaultKind::kKill);
  EXPECT_EQ(e[0].fault.worker, 3u);
  EXPECT_EQ(e[0].fault.at_ns, 30'000'000'000);
  EXPECT_EQ(e[1].fault.kind, FaultKind::kHang);
  EXPECT_EQ(e[2].fault.kind, FaultKind::kDrain);
  EXPECT_EQ(e[2].fault.at_ns, 50'500'000'000);
  EXPECT_EQ(e[3].fault.kind, FaultKind::kAdd);
  EXPECT_EQ(e[3].group, "gpu");
  EXPECT_FALSE(e[3].node);
  ASSERT_TRUE(e[4].node);
  EXPECT_EQ(e[4].node->name, "spare");
  EXPECT_EQ(e[4].node->kv_blocks, 4000);
  EXPECT_EQ(e[4].node->link.latency_ns, 50'000);
  EXPECT_EQ(e[4].node->cost, (std::filesystem::path(y.path).parent_path() / "c.json").string())
      << "relative to the events file";
  EXPECT_EQ(e[5].fault.kind, FaultKind::kCut);
  EXPECT_EQ(e[5].fault.worker, 4u);
  EXPECT_EQ(e[5].fault.duration_ns, 2'500'000'000);
}

TEST(EventFile, AddsAreBuiltAsTheClustersOwnWorkers) {
  test::TempFile cost("", ".json");
  write_cost_profile(cost.path, small_profile());
  ClusterSpec spec;
  NodeGroup gpu;
  gpu.name = "gpu";
  gpu.count = 2;
  gpu.cost = cost.path;
  gpu.kv_blocks = 300;
  gpu.link.latency_ns = 20'000;
  spec.groups = {gpu};
  CostProfiles profiles;
  std::vector<EventEntry> entries(3);
  entries[0].fault = {FaultKind::kAdd, 0, 1};
  entries[0].group = "gpu";
  entries[1].fault = {FaultKind::kAdd, 0, 2};
  entries[1].node = NodeGroup{};
  entries[1].node->name = "spare";
  entries[1].node->kv_blocks = 50;
  entries[2].fault = {FaultKind::kCut, 1, 3, 5};
  const auto f = resolve_events(entries, spec, profiles, cost.path);
  ASSERT_EQ(f.size(), 3u);
  ASSERT_TRUE(f[0].add);
  EXPECT_EQ(f[0].add->node, "gpu");
  EXPECT_EQ(f[0].add->scheduler.num_blocks, 300);
  EXPECT_EQ(f[0].add->link.latency_ns, 20'000);
  ASSERT_TRUE(f[1].add);
  EXPECT_EQ(f[1].add->scheduler.num_blocks, 50);
  EXPECT_TRUE(f[1].add->link.in_process()) << "no network given: no delay";
  EXPECT_FALSE(f[2].add);
  EXPECT_EQ(f[2].duration_ns, 5);
  entries[0].group = "cpu";
  try {
    resolve_events(entries, spec, profiles, cost.path);
    FAIL() << "an unknown group";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'cpu'; the cluster has gpu"), std::string::npos) << e.what();
  }
}

TEST(EventFile, MistakesNameTheEntryAndTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"events:\n  - {at: 1, kil: 3}\n", "events[0]: unknown key 'kil'"},
      {"events:\n  - {at: 1, kill: 3}\n  - {kill: 2}\n", "events[1]: needs 'at'"},
      {"events:\n  - {at: 1}\n", "events[0]: needs exactly one of kill, hang, drain, cut, add"},
      {"events:\n  - {at: 1, kill: 3, hang: 2}\n", "events[0]: needs exactly one of"},
      {"events:\n  - {at: -1, kill: 3}\n", "events[0].at: must be a non-negative number"},
      {"events:\n  - {at: x, kill: 3}\n", "events[0].at: must be a number"},
      {"events:\n  - {at: 1, kill: 0}\n", "events[0].kill: must lie in [1, "},
      {"events:\n  - {at: 1, drain: two}\n", "events[0].drain: must be an integer"},
      {"events:\n  - {at: 1, cut: 2}\n", "events[0]: a cut needs 'for'"},
      {"events:\n  - {at: 1, cut: 2, for: 0}\n", "events[0].for: must be > 0"},
      {"events:\n  - {at: 1, kill: 2, for: 3}\n", "events[0]: 'for' belongs to a cut"},
      {"events:\n  - {at: 1, add: {node: gpu, kv_blocks: 3}}\n", "events[0].add: unknown key 'kv_blocks'"},
      {"events:\n  - {at: 1, add: {count: 2}}\n", "events[0].add: unknown key 'count'"},
      {"events:\n  - {at: 1, add: {kv_memory: 1GB}}\n", "events[0].add.kv_memory: bad size '1GB'"},
      {"events:\n  - {at: 1, add: {local: true, network: {latency_us: 5}}}\n",
       "events[0].add: a local node has no network"},
      {"events:\n  - {at: 1, add: 3}\n", "events[0].add: must be a mapping"},
      {"event:\n  - {at: 1, kill: 3}\n", "top level: unknown key 'event'"},
      {"events: {at: 1, kill: 3}\n", "events: must be a list of events"},
      {"events: [\n", "not valid YAML"},
  };
  for (const auto& [text, want] : cases) {
    test::TempFile y(text, ".yaml");
    try {
      load_events_file(y.path, parse_memory);
      ADD_FAILURE() << "accepted:\n" << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(y.path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << "\nwanted: " << want;
    }
  }
  EXPECT_THROW(load_events_file("/nonexistent/events.yaml", parse_memory), std::runtime_error);
}

}  // namespace
}  // namespace troupe::cluster::sim
