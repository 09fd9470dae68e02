// The parallel simulation (SimOptions::parallel: the workers' own events in
// two lanes on two threads, arrivals and samples between their phases) must
// be the serial simulation, bit for bit: whole reports, every token's time,
// every worker's counts, on runs where the lanes share prefixes, preempt,
// refuse, tie and end at once.
#include <gtest/gtest.h>

#include <sstream>

#include "cluster/sim/cost_profile.hpp"
#include "cluster/sim/simulator.hpp"
#include "cluster/sim/workload.hpp"
#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

using test::constant_cost;
using test::json_of;
using test::request;
using test::worker;
constexpr int64_t kMs = 1'000'000;

// Two runs agree on everything.
void expect_same(const SimResult& parallel, const SimResult& serial) {
  EXPECT_EQ(json_of(parallel), json_of(serial));
  EXPECT_EQ(parallel.events, serial.events);
  EXPECT_EQ(parallel.end_ns, serial.end_ns);
  ASSERT_EQ(parallel.requests.size(), serial.requests.size());
  for (size_t i = 0; i < serial.requests.size(); ++i) {
    EXPECT_EQ(parallel.requests[i].token_ns, serial.requests[i].token_ns) << i;
    EXPECT_EQ(parallel.requests[i].start_ns, serial.requests[i].start_ns) << i;
    EXPECT_EQ(parallel.requests[i].end_ns, serial.requests[i].end_ns) << i;
    EXPECT_EQ(parallel.requests[i].error, serial.requests[i].error) << i;
    EXPECT_EQ(parallel.scheduled_ns[i], serial.scheduled_ns[i]) << i;
    EXPECT_EQ(parallel.cached_tokens[i], serial.cached_tokens[i]) << i;
    EXPECT_EQ(parallel.worker[i], serial.worker[i]) << i;
  }
  ASSERT_EQ(parallel.workers.size(), serial.workers.size());
  for (size_t i = 0; i < serial.workers.size(); ++i) {
    EXPECT_EQ(parallel.workers[i].steps, serial.workers[i].steps) << i;
    EXPECT_EQ(parallel.workers[i].busy_ns, serial.workers[i].busy_ns) << i;
    EXPECT_EQ(parallel.workers[i].tokens_run, serial.workers[i].tokens_run) << i;
    EXPECT_EQ(parallel.workers[i].preemptions, serial.workers[i].preemptions) << i;
    EXPECT_EQ(parallel.workers[i].prefix_hit_tokens, serial.workers[i].prefix_hit_tokens) << i;
    EXPECT_EQ(parallel.workers[i].refused_items, serial.workers[i].refused_items) << i;
  }
  ASSERT_EQ(parallel.series.size(), serial.series.size());
  for (size_t i = 0; i < serial.series.size(); ++i) {
    EXPECT_EQ(parallel.series[i].output_tokens, serial.series[i].output_tokens) << i;
    EXPECT_EQ(parallel.series[i].finished, serial.series[i].finished) << i;
    EXPECT_EQ(parallel.series[i].running, serial.series[i].running) << i;
  }
}

// Runs `w` serially and in parallel, with the tables in line and with them
// put off to the lanes' idle moments; all must agree on everything.
void expect_same_run(const std::vector<WorkloadRequest>& w, SimOptions o, const char* what) {
  o.parallel = false;
  o.tables_on_thread = false;
  const SimResult serial = simulate(w, o);
  o.parallel = true;
  for (bool later : {false, true}) {
    SCOPED_TRACE(std::string(what) + (later ? ", tables put off" : ", tables in line"));
    o.tables_on_thread = later;
    expect_same(simulate(w, o), serial);
  }
}

std::vector<WorkloadRequest> poisson(int32_t n, double rate, uint64_t seed, const char* in, const char* out) {
  SyntheticOptions so;
  so.num_requests = n;
  so.request_rate = rate;
  so.seed = seed;
  so.input = parse_length_distribution(in);
  so.output = parse_length_distribution(out);
  return generate_synthetic(so);
}

// Five unlike workers (step costs, links, pools small enough to preempt).
SimOptions unlike_workers() {
  SimOptions o;
  for (int i = 0; i < 5; ++i) {
    SimWorkerSpec x = worker(constant_cost((2 + i % 3) * kMs), 20 + 6 * i);
    x.link.latency_ns = (i % 2) * 250'000;
    o.workers.push_back(x);
  }
  o.sample_interval_ns = 50 * kMs;
  return o;
}

TEST(SimulatorParallel, OpenLoopRunsAreTheSerialRun) {
  const auto w = poisson(400, 300, 5, "uniform:60:0.8", "uniform:30:0.9");
  SimOptions o = unlike_workers();
  for (auto placement : {core::PlacementPolicy::kPrefixAffinity, core::PlacementPolicy::kLeastLoaded,
                         core::PlacementPolicy::kRoundRobin}) {
    o.batcher.placement = placement;
    o.worker_tables = true;
    expect_same_run(w, o, core::to_string(placement));
    o.worker_tables = false;
    expect_same_run(w, o, "without tables");
  }
  o.sample_interval_ns = 0;
  expect_same_run(w, o, "no time series");
  int64_t preemptions = 0;
  for (const auto& x : simulate(w, o).workers) preemptions += x.preemptions;
  EXPECT_GT(preemptions, 0) << "the pools must be small enough to preempt";
}

TEST(SimulatorParallel, SharedPrefixesAcrossLanesAreTheSerialRun) {
  // Mooncake-style ids: four system prompts shared by every request, so
  // workers of both lanes cache the same first blocks (the batcher's index of
  // them is changed by both lanes in a phase) and placement follows them.
  std::vector<WorkloadRequest> w;
  for (int i = 0; i < 300; ++i) {
    WorkloadRequest r = request(i * 3 * kMs, 48 + (i % 5) * 16, 8 + i % 13);
    r.hash_ids = {static_cast<uint64_t>(i % 4), static_cast<uint64_t>(100 + i % 7),
                  static_cast<uint64_t>(1000 + i)};
    w.push_back(r);
  }
  SimOptions o = unlike_workers();
  o.prompts.trace_block_tokens = 16;
  expect_same_run(w, o, "shared prefixes");
  const SimResult r = simulate(w, o);
  int64_t hits = 0;
  for (int64_t c : r.cached_tokens) hits += c;
  EXPECT_GT(hits, 0) << "the prefixes must hit";
}

TEST(SimulatorParallel, SimultaneousEventsAreTheSerialRun) {
  // Everything at t = 0 on workers of one cost: steps of several workers end
  // at the same nanosecond, and the last requests of both lanes end together.
  std::vector<WorkloadRequest> w;
  for (int i = 0; i < 64; ++i) w.push_back(request(0, 32, 16));
  SimOptions o;
  for (int i = 0; i < 4; ++i) o.workers.push_back(worker(constant_cost(4 * kMs), 64));
  expect_same_run(w, o, "ties");
  o.batcher.placement = core::PlacementPolicy::kRoundRobin;
  expect_same_run(w, o, "ties, round robin");
}

TEST(SimulatorParallel, RefusalsAndFailuresAreTheSerialRun) {
  // A worker whose table is smaller than its scheduler's pool refuses items
  // (tables in line in the lanes); overlong requests fail or are clipped.
  const auto w = poisson(120, 200, 9, "uniform:40:0.5", "uniform:20:0.5");
  SimOptions o;
  o.workers = {worker(constant_cost(2 * kMs), 24, 64), worker(constant_cost(3 * kMs), 24, 64),
               worker(constant_cost(2 * kMs), 24, 64)};
  o.workers[1].table_blocks = 6;
  expect_same_run(w, o, "refusals");
  const SimResult r = simulate(w, o);
  EXPECT_GT(r.workers[1].refused_items, 0);
  o.workers[1].table_blocks = 0;
  o.overlong = OverlongPolicy::kFail;
  expect_same_run(w, o, "overlong requests fail");
  o.overlong = OverlongPolicy::kClip;
  expect_same_run(w, o, "overlong requests clipped");
}

TEST(SimulatorParallel, ARunThatEndsWithARefusalIsTheSerialRun) {
  // The last request arrives long after the others finished and is refused
  // at once (too long for every worker): the run ends at its arrival, in the
  // main thread, not at the lanes' last event.
  std::vector<WorkloadRequest> w;
  for (int i = 0; i < 20; ++i) w.push_back(request(i * kMs, 30, 10));
  w.push_back(request(5'000 * kMs, 5000, 10));
  SimOptions o;
  o.workers = {worker(constant_cost(2 * kMs)), worker(constant_cost(3 * kMs))};
  o.overlong = OverlongPolicy::kFail;
  expect_same_run(w, o, "the last request refused");
  const SimResult r = simulate(w, o);
  EXPECT_FALSE(r.requests.back().success);
  EXPECT_EQ(r.end_ns, 5'000 * kMs);
  std::vector<WorkloadRequest> refused;
  for (int i = 0; i < 4; ++i) refused.push_back(request(i * kMs, 5000, 10));
  expect_same_run(refused, o, "every request refused");
}

TEST(SimulatorParallel, AnErrorOnEitherThreadIsThrownToTheCaller) {
  // Prompts are built ahead by whichever thread waits: one that cannot be
  // built (no vocabulary) throws to the caller as in a serial run, never
  // from a thread that has nowhere to throw to.
  const auto w = poisson(40, 200, 4, "uniform:40:0.5", "uniform:20:0.5");
  SimOptions o = unlike_workers();
  o.prompts.vocab_size = 0;
  EXPECT_THROW(simulate(w, o), std::invalid_argument);
  o.parallel = true;
  for (int i = 0; i < 20; ++i)  // which thread builds the first prompts is a race: run it often
    EXPECT_THROW(simulate(w, o), std::invalid_argument) << i;
}

TEST(SimulatorParallel, RunsThatCannotSplitRunSerially) {
  // A concurrency limit, a fault, a step log: the parallel option changes
  // nothing there (they run serially), and the step log still has every step.
  const auto w = poisson(150, 250, 3, "uniform:40:0.5", "uniform:20:0.5");
  SimOptions o = unlike_workers();
  o.max_concurrency = 12;
  expect_same_run(w, o, "a concurrency limit");
  o.max_concurrency = 0;
  o.faults = {{FaultKind::kKill, 2, 100 * kMs}};
  o.node_loss_ns = 0;
  expect_same_run(w, o, "a fault");
  o.faults.clear();
  auto text = std::make_shared<std::ostringstream>();
  o.step_log = std::make_shared<core::StepLog>(text);
  o.parallel = true;
  const SimResult r = simulate(w, o);
  int64_t steps = 0;
  for (const auto& x : r.workers) steps += x.steps;
  test::TempFile f(text->str(), ".jsonl");
  EXPECT_EQ(static_cast<int64_t>(read_step_log(f.path).size()), steps);
}

}  // namespace
}  // namespace troupe::cluster::sim
