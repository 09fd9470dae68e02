// Membership changes and link cuts in virtual time: a worker added at t takes
// requests only after t; a cut link only delays when it is short, loses the
// worker (its requests moved, recomputed) when it lasts the liveness window,
// after which its node comes back as a new worker; a step held past its
// deadline by a cut is found out as a hang is. Each run is a pure function of
// its inputs.
#include <gtest/gtest.h>

#include "cluster/sim/sim_report.hpp"
#include "cluster/sim/simulator.hpp"
#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

using test::constant_cost;
using test::fault_workload;
using test::json_of;
using test::worker;

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kLatency = 50'000;  // 50 us each way

// four_workers() on remote links (a local worker has no link to cut).
SimOptions remote_workers() {
  SimOptions o = test::four_workers();
  for (SimWorkerSpec& w : o.workers) w.link.latency_ns = kLatency;
  return o;
}

SimFault cut(uint64_t worker, int64_t at, int64_t duration) {
  return {FaultKind::kCut, worker, at, duration};
}

SimFault add(int64_t at, const SimWorkerSpec& w) {
  return {FaultKind::kAdd, 0, at, 0, std::make_shared<const SimWorkerSpec>(w)};
}

TEST(SimulatorEvents, AnAddedWorkerTakesRequestsOnlyAfterItJoins) {
  const auto w = fault_workload();
  SimOptions o = remote_workers();
  const SimResult plain = simulate(w, o);
  SimWorkerSpec extra = o.workers[0];
  extra.node = "spare";
  o.faults = {add(1'000 * kMs, extra)};
  const SimResult r = simulate(w, o);
  ASSERT_EQ(r.workers.size(), 5u);
  EXPECT_EQ(r.faults[0].fault.worker, 5u) << "the next id";
  EXPECT_EQ(r.workers[4].node, "spare");
  int on_new = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(r.requests[i].success) << i;
    if (r.worker[i] != 5) continue;
    ++on_new;
    EXPECT_GE(r.requests[i].start_ns, 1'000 * kMs) << i << ": sent before the worker joined";
    EXPECT_GE(r.scheduled_ns[i], 1'000 * kMs) << i;
  }
  EXPECT_GT(on_new, 20) << "round-robin gives it a fifth of what comes after 1 s";
  EXPECT_GT(r.workers[4].steps, 0);
  for (const SeriesPoint& p : r.series) {
    ASSERT_EQ(p.workers.size(), 5u);
    if (p.t_ns <= 1'000 * kMs) {
      EXPECT_EQ(p.workers[4].busy, 0) << p.t_ns;
    }
  }
  EXPECT_EQ(r.faults[0].requests_moved, 0);
  EXPECT_EQ(json_of(simulate(w, o)), json_of(r));
  EXPECT_NE(json_of(r), json_of(plain));
  EXPECT_NE(format_fault_summary(r).find("add   worker 5 at 1.000 s: node spare joins"), std::string::npos)
      << format_fault_summary(r);
}

TEST(SimulatorEvents, AShortCutDelaysButMovesNothing) {
  const auto w = fault_workload();
  SimOptions o = remote_workers();
  const SimResult plain = simulate(w, o);
  o.faults = {cut(2, 1'000 * kMs, 1'000 * kMs)};  // 1 s < the liveness window (3 s)
  const SimResult r = simulate(w, o);
  const FaultReport& f = r.faults[0];
  EXPECT_EQ(f.removed_ns, -1);
  EXPECT_EQ(f.returned_ns, 2'000 * kMs);
  EXPECT_EQ(f.new_worker, 0u);
  EXPECT_EQ(f.requests_moved, 0);
  EXPECT_EQ(f.tokens_recomputed, 0);
  ASSERT_EQ(r.workers.size(), 4u);
  int held = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(r.requests[i].success) << i;
    EXPECT_FALSE(r.affected[i]) << i;
    if (r.worker[i] != 2) continue;
    // No token of worker 2 reaches the head while its link is down (a result
    // sent just before the cut may still arrive just after it).
    for (int64_t t : r.requests[i].token_ns.to_vector())
      EXPECT_FALSE(t > 1'001 * kMs && t < 2'000 * kMs) << i;
    if (plain.requests[i].start_ns < 1'000 * kMs && plain.requests[i].end_ns > 1'000 * kMs) {
      ++held;
      EXPECT_GE(r.requests[i].end_ns, plain.requests[i].end_ns + 900 * kMs) << i << ": held by the cut";
    }
  }
  EXPECT_GT(held, 0);
  EXPECT_EQ(json_of(simulate(w, o)), json_of(r));
  EXPECT_NE(format_fault_summary(r).find("cut   worker 2 at 1.000 s: link down for 1.000 s, back at 2.000 s, "
                                         "0 requests moved"),
            std::string::npos)
      << format_fault_summary(r);
}

TEST(SimulatorEvents, ALongCutLosesTheWorkerAndItsNodeComesBackAsANewOne) {
  const auto w = fault_workload();
  SimOptions o = remote_workers();
  o.node_loss_ns = 1'000 * kMs;                   // the liveness window (serve's: 3 s)
  o.faults = {cut(2, 1'000 * kMs, 2'000 * kMs)};  // longer than that
  const SimResult r = simulate(w, o);
  const FaultReport& f = r.faults[0];
  EXPECT_EQ(f.removed_ns, 2'000 * kMs) << "cut + the liveness window";
  EXPECT_EQ(f.returned_ns, 3'000 * kMs);
  EXPECT_EQ(f.new_worker, 5u);
  EXPECT_GT(f.requests_moved, 0);
  EXPECT_GT(f.tokens_recomputed, 0);
  ASSERT_EQ(r.workers.size(), 5u);
  EXPECT_EQ(r.workers[4].node, r.workers[1].node) << "the same node, registered again";
  // Worker 2 gets no plan after the cut (its two steps in flight never come
  // back): it computes at most those.
  EXPECT_LE(r.workers[1].busy_ns, 1'000 * kMs + 2 * 5 * kMs);
  int affected = 0, on_new = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(r.requests[i].success) << i;
    affected += r.affected[i];
    if (r.worker[i] == 5) {
      ++on_new;
      EXPECT_GE(r.scheduled_ns[i], 3'000 * kMs) << i;
    }
  }
  EXPECT_EQ(affected, f.requests_moved);
  EXPECT_GT(on_new, 0) << "the new worker takes requests";
  EXPECT_EQ(json_of(simulate(w, o)), json_of(r));
  EXPECT_NE(format_fault_summary(r).find("cut   worker 2 at 1.000 s: link down for 2.000 s, gone at 2.000 s, "
                                         "back as worker 5 at 3.000 s"),
            std::string::npos)
      << format_fault_summary(r);
}

// A cut shorter than the liveness window holds the worker's results past its
// oldest step's deadline: the watchdog (Batcher::take_hung) lets it go, and
// the node, reset, registers again when the link is back.
TEST(SimulatorEvents, ACutPastAStepDeadlineIsFoundOutAsAHang) {
  const auto w = fault_workload();
  SimOptions o = remote_workers();
  o.batcher.step_timeout_floor_ns = 1'000 * kMs;
  o.watchdog_interval_ns = 100 * kMs;
  o.faults = {cut(3, 1'000 * kMs, 2'000 * kMs)};
  const SimResult r = simulate(w, o);
  const FaultReport& f = r.faults[0];
  // Its oldest step became the oldest at most two 5 ms steps before the cut;
  // the deadline is the floor; the watchdog ticks every 100 ms.
  EXPECT_GE(f.removed_ns, 1'990 * kMs);
  EXPECT_LE(f.removed_ns, 2'100 * kMs);
  EXPECT_GT(f.requests_moved, 0);
  EXPECT_EQ(f.returned_ns, 3'000 * kMs);
  EXPECT_EQ(f.new_worker, 5u);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(r.requests[i].success) << i;
  o.batcher.step_timeout_floor_ns = 5'000 * kMs;  // the default: the same cut only delays
  const SimResult later = simulate(w, o);
  EXPECT_EQ(later.faults[0].removed_ns, -1);
  EXPECT_EQ(later.faults[0].new_worker, 0u);
}

// Events name the workers that join: a kill of the added worker, a cut of
// the one that came back.
TEST(SimulatorEvents, EventsReachWorkersThatJoined) {
  const auto w = fault_workload();
  SimOptions o = remote_workers();
  o.node_loss_ns = 0;
  o.faults = {add(500 * kMs, o.workers[0]), {FaultKind::kKill, 5, 1'500 * kMs}};
  const SimResult r = simulate(w, o);
  EXPECT_EQ(r.faults[1].removed_ns, 1'500 * kMs);
  EXPECT_LE(r.workers[4].busy_ns, 1'000 * kMs);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(r.requests[i].success) << i;
}

TEST(SimulatorEvents, BadEvents) {
  const auto w = fault_workload();
  SimOptions local = test::four_workers();
  local.faults = {cut(2, 0, kMs)};
  EXPECT_THROW(simulate(w, local), std::invalid_argument) << "a local worker has no link";
  SimOptions o = remote_workers();
  o.faults = {cut(2, 0, 0)};
  EXPECT_THROW(simulate(w, o), std::invalid_argument) << "a cut lasts > 0";
  o.faults = {cut(6, 0, kMs)};  // 4 workers and this cut's node coming back: 5 at most
  EXPECT_THROW(simulate(w, o), std::invalid_argument);
  o.faults = {{FaultKind::kAdd, 0, 0}};
  EXPECT_THROW(simulate(w, o), std::invalid_argument) << "an add with no worker";
  SimWorkerSpec other = o.workers[0];
  other.scheduler.vocab_size = 1000;
  o.faults = {add(0, other)};
  EXPECT_THROW(simulate(w, o), std::invalid_argument) << "another model";
}

}  // namespace
}  // namespace troupe::cluster::sim
