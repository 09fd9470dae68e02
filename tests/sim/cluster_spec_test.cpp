// Cluster files: every key read, unknown keys and bad values refused with
// the file and key named; workers built from profiles; sweeps and searches.
#include "cluster/sim/cluster_spec.hpp"

#include <gtest/gtest.h>

#include "cluster/sim/sweep.hpp"
#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

using test::parse_memory;
using test::small_profile;

struct Files {
  Files() {
    write_cost_profile(cost.path, small_profile());
    write_cost_profile(cost32.path, small_profile(32, 256));
  }
  test::TempFile cost{"", ".json"}, cost32{"", ".json"};
};

TEST(ClusterSpec, ReadsEveryKey) {
  Files f;
  test::TempFile y(
      "placement: least-loaded\n"
      "scheduler: {max_num_seqs: 8, max_batched_tokens: 512, block_size: 16, prefix_caching: false,\n"
      "            chunked_prefill: false, max_steps_in_flight: 1}\n"
      "network: {latency_us: 50, bandwidth_gbps: 8}\n"
      "nodes:\n"
      "  - {name: head, local: true, cost: " +
          f.cost.path +
          ", kv_memory: 1MiB}\n"
          "  - name: far\n    count: 3\n    workers: 2\n    cost: " +
          f.cost.path + "\n    kv_blocks: 77\n    network: {latency_us: 20}\n",
      ".yaml");
  const ClusterSpec s = load_cluster_file(y.path, parse_memory);
  EXPECT_EQ(s.placement, core::PlacementPolicy::kLeastLoaded);
  EXPECT_EQ(s.scheduler.max_num_seqs, 8);
  EXPECT_EQ(s.scheduler.max_batched_tokens, 512);
  EXPECT_FALSE(s.scheduler.prefix_caching);
  EXPECT_FALSE(s.scheduler.chunked_prefill);
  EXPECT_EQ(s.scheduler.max_steps_in_flight, 1);
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_TRUE(s.groups[0].local);
  EXPECT_EQ(s.groups[0].kv_memory, 1 << 20);
  EXPECT_EQ(s.groups[1].count, 3);
  EXPECT_EQ(s.groups[1].link.latency_ns, 20'000);
  EXPECT_EQ(s.groups[1].link.bandwidth_bytes_per_s, 1e9);  // 8 Gb/s from the default
  EXPECT_EQ(total_workers(s), 7);

  CostProfiles profiles;
  const auto w = build_workers(s, profiles);
  ASSERT_EQ(w.size(), 7u);
  EXPECT_EQ(w[0].scheduler.num_blocks, (1 << 20) / (1024 * 16));
  EXPECT_TRUE(w[0].link.in_process());
  EXPECT_EQ(w[1].node, "far-0");
  EXPECT_EQ(w[6].node, "far-2");
  EXPECT_EQ(w[6].scheduler.num_blocks, 77);
  EXPECT_EQ(w[6].scheduler.max_model_len, 128);
  EXPECT_EQ(w[6].scheduler.max_num_seqs, 8);
  EXPECT_EQ(w[1].cost, w[6].cost);  // one profile, loaded once
  EXPECT_EQ(total_workers(with_last_group_nodes(s, 10)), 21);
}

TEST(ClusterSpec, CostScalesMultiplyEveryStepTime) {
  Files f;
  test::TempFile y("nodes:\n  - {cost: " + f.cost.path + "}\n  - {cost: " + f.cost.path +
                       ", cost_scale: 2.5}\n  - {cost: " + f.cost.path + ", cost_scale: 1}\n",
                   ".yaml");
  const ClusterSpec s = load_cluster_file(y.path, parse_memory);
  EXPECT_EQ(s.groups[0].cost_scale, 1.0);
  EXPECT_EQ(s.groups[1].cost_scale, 2.5);
  StepShape one;
  one.add(0, 1, true);
  CostProfiles plain;
  auto w = build_workers(s, plain);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].cost->predict_ns(one), 1'000'000);  // small_profile(): 1 ms a step
  EXPECT_EQ(w[1].cost->predict_ns(one), 2'500'000);
  EXPECT_EQ(w[0].cost, w[2].cost);  // same profile, same scale: one model
  CostProfiles times4(4);           // --cost-scale 4: times each group's own
  w = build_workers(s, times4);
  EXPECT_EQ(w[0].cost->predict_ns(one), 4'000'000);
  EXPECT_EQ(w[1].cost->predict_ns(one), 10'000'000);
  EXPECT_THROW(CostProfiles(0), std::invalid_argument);
  EXPECT_THROW(CostProfiles(std::nan("")), std::invalid_argument);
}

TEST(ClusterSpec, CostPathsAreRelativeToTheFile) {
  Files f;
  const std::string dir = f.cost.path.substr(0, f.cost.path.rfind('/'));
  const std::string name = f.cost.path.substr(dir.size() + 1);
  test::TempFile y("nodes: [{cost: " + name + "}, {}]\n", ".yaml");
  const ClusterSpec s = load_cluster_file(y.path, parse_memory);
  EXPECT_EQ(s.groups[0].cost, dir + "/" + name);
  EXPECT_EQ(s.groups[1].cost, "");  // the caller's --cost
  CostProfiles profiles;
  EXPECT_THROW(build_workers(s, profiles), std::invalid_argument);
}

TEST(ClusterSpec, BadFilesNameTheKey) {
  auto expect = [](const std::string& text, const std::string& what) {
    test::TempFile y(text, ".yaml");
    try {
      load_cluster_file(y.path, parse_memory);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(y.path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect("nodes: [{cost: c.json, wrokers: 2}]\n", "unknown key 'wrokers'");
  expect("placment: round-robin\nnodes: [{cost: c}]\n", "unknown key 'placment'");
  expect("placement: random\nnodes: [{cost: c}]\n", "placement");
  expect("nodes: []\n", "nodes");
  expect("nodes: [{cost: c, count: 0}]\n", "nodes[0].count");
  expect("nodes: [{cost: c, cost_scale: 0}]\n", "nodes[0].cost_scale: must be > 0");
  expect("nodes: [{cost: c, cost_scale: -2}]\n", "nodes[0].cost_scale");
  expect("nodes: [{cost: c, cost_scale: fast}]\n", "nodes[0].cost_scale: must be a number");
  expect("nodes: [{cost: c, kv_memory: lots}]\n", "nodes[0].kv_memory");
  expect("nodes: [{cost: c, kv_memory: 1MiB, kv_blocks: 3}]\n", "not both");
  expect("nodes: [{cost: c, local: true, network: {latency_us: 3}}]\n", "local node has no network");
  expect("scheduler: {max_num_seqs: many}\nnodes: [{cost: c}]\n", "scheduler.max_num_seqs");
  expect("network: {bandwidth_gbps: 0}\nnodes: [{cost: c}]\n", "bandwidth_gbps");
  expect("nodes: [{cost: c}\n", "not valid YAML");
  EXPECT_THROW(load_cluster_file("/nonexistent/cluster.yaml", parse_memory), std::runtime_error);
}

TEST(ClusterSpec, ProfilesMustFitTheScheduler) {
  Files f;
  ClusterSpec s;
  NodeGroup g;
  g.cost = f.cost32.path;  // measured with 32-token blocks
  s.groups = {g};
  CostProfiles profiles;
  try {
    build_workers(s, profiles);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("block size 32"), std::string::npos) << e.what();
  }
  s.scheduler.block_size = 32;
  g.cost = f.cost.path;
  s.groups.push_back(g);  // the two differ only in block size: still refused
  EXPECT_THROW(build_workers(s, profiles), std::invalid_argument);
  s.groups.pop_back();
  EXPECT_EQ(cluster_model(s, profiles).n_positions, 256);
}

TEST(Sweep, ParsesRates) {
  EXPECT_EQ(parse_rate_sweep("rate=1:3:0.5"), (std::vector<double>{1, 1.5, 2, 2.5, 3}));
  EXPECT_EQ(parse_rate_sweep("rate=0.1:0.3:0.1").size(), 3u);
  for (const char* bad : {"1:3:1", "rate=3:1:1", "rate=0:1:1", "rate=1:2:0", "rate=1:2", "rate=a:b:c"})
    EXPECT_THROW(parse_rate_sweep(bad), std::invalid_argument) << bad;
}

TEST(Sweep, SmallestPassingUsesFewCalls) {
  for (int32_t answer : {1, 2, 7, 64, 100}) {
    std::vector<std::pair<int32_t, bool>> seen;
    EXPECT_EQ(smallest_passing(
                  1000, [&](int32_t n) { return n >= answer; }, &seen),
              answer);
    EXPECT_LE(seen.size(), 2u * 10 + 2) << answer;
  }
  EXPECT_EQ(smallest_passing(50, [](int32_t n) { return n >= 51; }), -1);
  EXPECT_EQ(smallest_passing(50, [](int32_t n) { return n >= 50; }), 50);
}

TEST(Sweep, AttainmentAndHighestRate) {
  core::ServingMetrics m;
  m.completed = 10;
  m.good_requests = 9;
  SloCheck c;
  c.slo.ttft_ms = 100;
  EXPECT_DOUBLE_EQ(attainment(m, 10, c), 0.9);
  EXPECT_TRUE(meets(m, 10, c));
  EXPECT_FALSE(meets(m, 11, c));  // a failed request counts against it
  c.slo = {};
  EXPECT_TRUE(meets(m, 10, c));
  EXPECT_FALSE(meets(m, 11, c));
  std::vector<SweepPoint> pts(3);
  pts[0].rate = 1, pts[0].meets = true;
  pts[1].rate = 2, pts[1].meets = true;
  pts[2].rate = 3, pts[2].meets = false;
  EXPECT_EQ(highest_rate_meeting(pts), 2);
  pts[0].meets = pts[1].meets = false;
  EXPECT_EQ(highest_rate_meeting(pts), -1);
}

}  // namespace
}  // namespace troupe::cluster::sim
