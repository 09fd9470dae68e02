// The head as one server with a queue (SimOptions::head, `simulate
// --head-cost`) and the head profile it comes from (`profile --head`).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "cluster/sim/head_cost.hpp"
#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

using test::constant_cost;
using test::fault_workload;
using test::four_workers;
using test::json_of;
using test::request;
using test::worker;

constexpr int64_t kMs = 1'000'000;

TEST(HeadCost, AFreeHeadChangesNothing) {
  const std::string plain = json_of(simulate(fault_workload(), four_workers()));
  SimOptions o = four_workers();
  o.head.idle_share = 0.5;  // no cost per event: still free
  EXPECT_TRUE(o.head.free());
  EXPECT_EQ(json_of(simulate(fault_workload(), o)), plain);
  EXPECT_EQ(plain.find("\"head\""), std::string::npos);
}

TEST(HeadCost, EachEventWaitsForTheHeadAndDelaysWhatFollows) {
  // Steps of 10 ms, two in flight. The head takes 1 ms for the request, then
  // plans both steps (they run 1-11 and 11-21 ms); each result costs 2 ms +
  // 0.5 ms for its token, so the tokens reach the client 2.5 ms after their
  // results reach the head.
  SimOptions o;
  o.workers = {worker(constant_cost(10 * kMs))};
  o.head = {1 * kMs, 2 * kMs, kMs / 2, 0};
  SimResult r = simulate({request(0, 40, 2)}, o);
  const auto& t = r.requests[0];
  ASSERT_TRUE(t.success) << t.error;
  EXPECT_EQ(t.start_ns, 0);  // the client sent it at 0, the head took it in by 1 ms
  EXPECT_EQ(r.scheduled_ns[0], 1 * kMs);
  EXPECT_EQ(t.token_ns.to_vector(), (std::vector<int64_t>{13 * kMs + kMs / 2, 23 * kMs + kMs / 2}));
  EXPECT_EQ(r.head_busy_ns, 1 * kMs + 2 * (2 * kMs + kMs / 2));
  EXPECT_EQ(r.head_max_wait_ns, 0);
  // Half a CPU taken by the idle work: every event takes twice as long.
  o.head.idle_share = 0.5;
  r = simulate({request(0, 40, 2)}, o);
  EXPECT_EQ(r.requests[0].token_ns.to_vector(), (std::vector<int64_t>{17 * kMs, 27 * kMs}));  // steps 2-12, 12-22 ms
  EXPECT_EQ(r.head_busy_ns, 12 * kMs);
  // Two requests at once: the second waits for the first's 1 ms, then for
  // room in the worker's two steps in flight: it joins the step the head plans
  // once the first result is applied (11 + 2.5 ms).
  o.head.idle_share = 0;
  r = simulate({request(0, 40, 2), request(0, 40, 2)}, o);
  EXPECT_EQ(r.requests[1].start_ns, 0);
  EXPECT_EQ(r.scheduled_ns[1], 13 * kMs + kMs / 2);
  EXPECT_EQ(r.head_max_wait_ns, 1 * kMs);
}

TEST(HeadCost, BusyTimeIsEveryEventsCostAndTheSeriesAddsUpToIt) {
  SimOptions o = four_workers();
  for (auto& w : o.workers) w.link.latency_ns = 100'000;
  o.head = {30'000, 20'000, 5'000, 0};
  o.sample_interval_ns = 100 * kMs;
  const SimResult r = simulate(fault_workload(), o);
  int64_t steps = 0, tokens = 0;
  for (const auto& w : r.workers) steps += w.steps;
  for (const auto& t : r.requests) {
    ASSERT_TRUE(t.success) << t.error;
    tokens += t.output_tokens;
  }
  EXPECT_EQ(r.head_busy_ns, static_cast<int64_t>(r.requests.size()) * 30'000 + steps * 20'000 + tokens * 5'000);
  double series = 0;
  int64_t prev = 0;
  for (const auto& p : r.series) {
    series += p.head_busy * static_cast<double>(p.t_ns - prev);
    prev = p.t_ns;
  }
  EXPECT_NEAR(series, static_cast<double>(r.head_busy_ns), 1e-6 * static_cast<double>(r.head_busy_ns));
  EXPECT_EQ(json_of(simulate(fault_workload(), o)), json_of(r));  // a pure function of its inputs
  const auto j = nlohmann::json::parse(json_of(r));
  EXPECT_NEAR(j["head"]["utilization"].get<double>(),
              static_cast<double>(r.head_busy_ns) / static_cast<double>(r.end_ns), 1e-12);
}

TEST(HeadCost, ArrivalsQueueForTheHeadAsAnMD1Queue) {
  // Only requests cost the head (D each), the workers next to nothing: the
  // head is an M/D/1 queue for arrivals, its mean wait rho D / (2 (1 - rho)).
  const double D = 1e6, rho = 0.6;
  SimOptions o;
  o.workers = {worker(constant_cost(1000), 4096)};
  o.head.request_ns = D;
  o.sample_interval_ns = 0;
  const SimResult r = simulate(test::one_token_requests(20000, rho / (D / 1e9), 5), o);
  std::vector<double> waits;
  for (size_t i = 0; i < r.requests.size(); ++i)
    waits.push_back(static_cast<double>(r.scheduled_ns[i] - r.requests[i].start_ns) - D);  // wait, then D
  const test::BatchMeans m = test::batch_means(waits);
  const double expected = rho * D / (2 * (1 - rho));
  EXPECT_LT(m.se, 0.05 * expected);
  EXPECT_NEAR(m.mean, expected, 4 * m.se) << "se " << m.se;
  EXPECT_NEAR(static_cast<double>(r.head_busy_ns), 20000 * D, 1.0);
}

TEST(HeadCost, ASlowHeadBoundsTheClusterAndAFaultStillRuns) {
  // Results cost the head 1 ms each: four workers of 0.1 ms steps serve at
  // most 1000 steps a second, whatever they could do.
  SimOptions o;
  for (int i = 0; i < 4; ++i) o.workers.push_back(worker(constant_cost(100'000), 256));
  o.max_concurrency = 32;
  o.head.step_ns = 1 * kMs;
  SimResult r = simulate(fault_workload(), o);
  int64_t steps = 0;
  for (const auto& w : r.workers) steps += w.steps;
  EXPECT_LE(static_cast<double>(steps) / (static_cast<double>(r.end_ns) / 1e9), 1000.0 * 1.0001);
  EXPECT_GT(static_cast<double>(r.head_busy_ns) / static_cast<double>(r.end_ns), 0.9);
  o.faults = {parse_fault(FaultKind::kKill, "2@1")};
  r = simulate(fault_workload(), o);
  for (const auto& t : r.requests) EXPECT_TRUE(t.success) << t.error;
  // Noticed node_loss_ns (3 s) after the kill, once the head is done with the
  // results before it (8 steps in flight at most, 1 ms each).
  EXPECT_GE(r.faults[0].removed_ns, 4'000'000'000);
  EXPECT_LT(r.faults[0].removed_ns, 4'010'000'000);
  EXPECT_EQ(json_of(simulate(fault_workload(), o)), json_of(r));
}

TEST(HeadCost, RefusesACostItCannotCharge) {
  SimOptions o = four_workers();
  o.head = {-1, 0, 0, 0};
  EXPECT_THROW(simulate(fault_workload(), o), std::invalid_argument);
  o.head = {1, 0, 0, 1.0};
  EXPECT_THROW(simulate(fault_workload(), o), std::invalid_argument);
}

HeadRun run_of(const HeadCost& c, double wall, int64_t req, int64_t steps, int64_t tokens) {
  HeadRun r;
  r.wall_s = wall;
  r.requests = req;
  r.steps = steps;
  r.tokens = tokens;
  r.cpu_s = predicted_cpu_s(c, r);
  return r;
}

TEST(HeadProfile, TheFitRecoversTheCostsThatMadeItsRuns) {
  const HeadCost truth{120'000, 90'000, 3'000, 0.02};
  HeadProfile p;
  p.runs = {run_of(truth, 2.4, 189, 11354, 11354), run_of(truth, 2.4, 923, 7825, 58170),
            run_of(truth, 2.4, 4115, 3151, 16518), run_of(truth, 2.6, 1210, 11059, 19482),
            run_of(truth, 3.0, 0, 0, 0)};
  fit(p);
  EXPECT_NEAR(p.cost.request_ns, truth.request_ns, 1e-3 * truth.request_ns);
  EXPECT_NEAR(p.cost.step_ns, truth.step_ns, 1e-3 * truth.step_ns);
  EXPECT_NEAR(p.cost.token_ns, truth.token_ns, 1e-3 * truth.token_ns);
  EXPECT_NEAR(p.cost.idle_share, truth.idle_share, 1e-3 * truth.idle_share);
  EXPECT_LT(p.fit_max_pct, 0.01);
  p.runs.resize(3);
  EXPECT_THROW(fit(p), std::invalid_argument);
}

TEST(HeadProfile, RoundTripsThroughItsFileAndRefusesOthers) {
  HeadProfile p;
  p.created = "2026-12-05T08:00:00Z";
  p.processor = "AMD EPYC";
  p.setup = "test";
  const HeadCost c{120'000, 90'000, 3'000, 0.02};
  p.runs = {run_of(c, 2.4, 189, 11354, 11354), run_of(c, 2.4, 923, 7825, 58170), run_of(c, 2.4, 4115, 3151, 16518),
            run_of(c, 3.0, 0, 0, 0)};
  fit(p);
  test::TempFile f("", ".json");
  write_head_profile(f.path, p);
  const HeadProfile q = read_head_profile(f.path);
  EXPECT_EQ(q.to_json().dump(), p.to_json().dump());
  test::TempFile cost(R"({"format": "troupe-cost-profile", "version": 1})", ".json");
  try {
    read_head_profile(cost.path);
    FAIL() << "a worker's profile read as a head's";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("troupe-head-profile"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(cost.path), std::string::npos) << e.what();
  }
  nlohmann::json j = p.to_json();
  j["head_cost"]["idle_share"] = 1.5;
  test::TempFile bad(j.dump(), ".json");
  EXPECT_THROW(read_head_profile(bad.path), std::runtime_error);
  j = p.to_json();
  j["runs"][0].erase("steps");
  test::TempFile missing(j.dump(), ".json");
  try {
    read_head_profile(missing.path);
    FAIL() << "a run without steps was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("steps"), std::string::npos) << e.what();
  }
}

TEST(HeadProfile, ShippedProfilesAreTheFitOfTheirRuns) {
  // docs/profiles/heads: a hand-edited or stale file fails.
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(TROUPE_PROFILES_DIR) + "/heads")) {
    SCOPED_TRACE(e.path().string());
    ++n;
    const HeadProfile p = read_head_profile(e.path().string());
    EXPECT_FALSE(p.processor.empty());
    HeadProfile q = p;
    fit(q);
    EXPECT_NEAR(q.cost.step_ns, p.cost.step_ns, 1e-6 * p.cost.step_ns);
    EXPECT_NEAR(q.cost.request_ns, p.cost.request_ns, 1e-6 * p.cost.request_ns);
    EXPECT_NEAR(q.cost.token_ns, p.cost.token_ns, 1e-6 * p.cost.token_ns);
    EXPECT_NEAR(q.fit_max_pct, p.fit_max_pct, 1e-6);
    EXPECT_GT(p.cost.step_ns, 0);
  }
  EXPECT_GE(n, 1u);
}

}  // namespace
}  // namespace troupe::cluster::sim
