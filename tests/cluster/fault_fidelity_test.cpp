// A node struck under load, served and simulated: a real head with three
// emulated workers (one per node, round-robin placement, so request i lands
// on the same worker in both) and `troupe bench` sending a seeded workload;
// node n2 is killed (SIGKILL), drained (SIGTERM) or hung (its `worker.step`
// failpoint) about 5 s in. `troupe simulate` of the same workload with the
// same fault at the same time must cost what the served run cost: the same
// requests moved and tokens recomputed (within 15%, and a request's worth at
// this small scale), and for a drain the node gone when the simulation lets
// it go. (The tables at 8 workers: docs/benchmarks.md,
// bench/bench_fault_fidelity.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"

namespace troupe::test {
namespace {

const char* const kWorkload =
    " --num-requests 90 --request-rate 9 --random-input-len 30 --random-output-len 90 --range-ratio 0 --seed "
    "3";

struct FaultRun {
  double moved = 0, tokens = 0;  // the head's counters
  double at_s = 0;               // when the fault struck, from the bench's start
  double exit_s = -1;            // drain: when the node exited; -1: it did not
  size_t workers_after = 0;      // at the head, after the bench
  int completed = 0;             // by the bench
  nlohmann::json sim;            // the simulation's report
};

json simulate(const TempDir& dir, const std::string& cost, const std::string& fault,
              const std::string& name) {
  auto r = run_command(shell_quote(bin()) + " simulate --cost " + shell_quote(cost) +
                       " --workers 3 --num-blocks 256 --placement round-robin --quiet" + kWorkload + " " +
                       fault + " --json " + shell_quote(dir.file(name)));
  EXPECT_EQ(r.status, 0) << r.output;
  return json::parse(std::ifstream(dir.file(name)));
}

// kind: "kill" (SIGKILL at 5 s), "drain" (SIGTERM at 5 s) or "hang" (the
// node's step near 5 s hangs; the time it fired read from its log).
FaultRun serve_and_simulate(const TempDir& dir, const std::string& kind) {
  FaultRun run;
  // 10 ms for a one-token step, 14 ms for 64 tokens
  const std::string cost = made_up_profile(dir, {1, 64}, {10e6, 14e6});
  std::vector<std::string> victim_env;
  if (kind == "hang") {
    // The step the victim runs near 5 s, at the simulated mean step rate.
    const json plain = simulate(dir, cost, "", "plain.json");
    double steps = 0;
    for (const auto& w : plain["workers"]) steps += w["steps"].get<double>() / 3;
    const long k = std::lround(5 * steps / plain["duration"].get<double>());
    victim_env = {"env", "TROUPE_FAILPOINTS=worker.step=hang@" + std::to_string(k)};
  }
  Head head(dir, "head", {"--workers", "0", "--placement", "round-robin"});
  std::vector<std::unique_ptr<Process>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(start_worker(dir, head, "n" + std::to_string(i), {"--workers", "1", "--emulate", cost},
                                 i == 2 ? victim_env : std::vector<std::string>{}));
    EXPECT_TRUE(head.wait_workers(static_cast<size_t>(i + 1))) << head.proc->log();  // joined in this order
  }
  const auto st = head.status();
  EXPECT_TRUE(st);
  if (!st) return run;
  uint32_t victim = 0;
  std::vector<uint32_t> ids;
  for (const auto& w : st->workers) ids.push_back(w.id);
  std::sort(ids.begin(), ids.end());
  for (const auto& w : st->workers)
    if (w.node == "n2")
      victim = static_cast<uint32_t>(std::find(ids.begin(), ids.end(), w.id) - ids.begin()) + 1;
  EXPECT_GT(victim, 0u);
  Process bench({"/bin/sh", "-c",
                 shell_quote(bin()) + " bench --to " + head.listen + kWorkload + " --json " +
                     shell_quote(dir.file("bench.json"))},
                dir.file("bench.log"));
  const auto t0 = std::chrono::steady_clock::now();
  const auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (kind == "hang") {
    const bool fired = eventually(
        [&] {
          return nodes[2]->log().find("failpoint worker.step fired") != std::string::npos || !bench.running();
        },
        seconds(60));
    run.at_s = since();
    EXPECT_TRUE(fired && nodes[2]->log().find("fired") != std::string::npos) << nodes[2]->log();
  } else {
    std::this_thread::sleep_for(seconds(5));
    run.at_s = since();
    nodes[2]->signal(kind == "kill" ? SIGKILL : SIGTERM);
    if (kind == "drain" && eventually([&] { return !nodes[2]->running(); }, seconds(60)))
      run.exit_s = since();
  }
  EXPECT_EQ(bench.wait(seconds(300)), std::optional<int>(0)) << bench.log();
  const auto after = head.status();
  EXPECT_TRUE(after);
  if (after) {
    run.moved = static_cast<double>(after->requests_moved);
    run.tokens = static_cast<double>(after->tokens_recomputed);
    run.workers_after = after->workers.size();
  }
  run.completed = json::parse(std::ifstream(dir.file("bench.json")))["completed"].get<int>();
  char at[32];
  std::snprintf(at, sizeof at, "%.3f", run.at_s);
  const std::string flag = kind == "kill"    ? "--fail-worker"
                           : kind == "drain" ? "--drain-worker"
                                             : "--hang-worker";
  // (A hung node, reset by the head, registers again with a fresh worker; the
  // simulator does that itself: its report names the new worker.)
  run.sim = simulate(dir, cost, flag + " " + std::to_string(victim) + "@" + at, "sim.json");
  for (size_t i = 0; i < 2; ++i) {
    nodes[i]->signal(SIGTERM);
    nodes[i]->wait(seconds(60));
  }
  return run;
}

void expect_moves_as_simulated(const FaultRun& r, const char* what) {
  const double sim_moved = r.sim["requests_moved"].get<double>(),
               sim_tokens = r.sim["tokens_recomputed"].get<double>();
  std::printf("node %s: served %.0f requests moved, %.0f tokens recomputed; simulated %.0f, %.0f\n", what,
              r.moved, r.tokens, sim_moved, sim_tokens);
  EXPECT_LE(std::abs(r.moved - sim_moved), 1 + 0.15 * sim_moved)
      << "served " << r.moved << ", simulated " << sim_moved;
  EXPECT_LE(std::abs(r.tokens - sim_tokens), 120 + 0.15 * sim_tokens)
      << "served " << r.tokens << ", simulated " << sim_tokens;
  EXPECT_EQ(r.completed, 90) << "nothing lost";
}

// The head notices the silence after 3 missed heartbeats in both.
TEST(Cluster, AKilledNodeCostsWhatTheSimulationSays) {
  TempDir dir;
  const FaultRun r = serve_and_simulate(dir, "kill");
  EXPECT_GT(r.sim["requests_moved"].get<double>(), 0);
  expect_moves_as_simulated(r, "killed");
  EXPECT_EQ(r.workers_after, 2u);
}

// The step deadline (5 s: the emulated worker's cost model predicts its
// steps) lets the worker go in both; the head's reset brings the node back
// as a new worker, in the simulation too (its fault names the new worker).
TEST(Cluster, AHungNodeCostsWhatTheSimulationSays) {
  TempDir dir;
  const FaultRun r = serve_and_simulate(dir, "hang");
  ASSERT_FALSE(r.sim["faults"][0]["removed_s"].is_null());
  const double removed = r.sim["faults"][0]["removed_s"].get<double>();
  EXPECT_GE(removed, r.at_s + 4.9) << "the 5 s step deadline";
  EXPECT_LE(removed, r.at_s + 5.3);
  EXPECT_GT(r.sim["requests_moved"].get<double>(), 0);
  expect_moves_as_simulated(r, "hung");
  EXPECT_EQ(r.workers_after, 3u) << "the node registered again";
  EXPECT_EQ(r.sim["workers"].size(), 4u);
  EXPECT_EQ(r.sim["faults"][0]["new_worker"].get<int>(), 4);
  EXPECT_GE(r.sim["faults"][0]["returned_s"].get<double>(), removed);
}

// A drained node finishes what it started and leaves: at the time the
// simulation lets it go (its last request's end), within 15% of the drain's
// length and 0.5 s (the head's shutdown message and the process's exit).
TEST(Cluster, ADrainedNodeCostsWhatTheSimulationSays) {
  TempDir dir;
  const FaultRun r = serve_and_simulate(dir, "drain");
  expect_moves_as_simulated(r, "drained");
  EXPECT_EQ(r.tokens, 0) << "a drain moves only requests not started";
  ASSERT_FALSE(r.sim["faults"][0]["removed_s"].is_null());
  const double sim_left = r.sim["faults"][0]["removed_s"].get<double>();
  std::printf("node drained at %.3f s: exited at %.3f s; simulated gone at %.3f s\n", r.at_s, r.exit_s,
              sim_left);
  EXPECT_GT(sim_left, r.at_s + 0.2) << "it had requests running";
  ASSERT_GT(r.exit_s, 0) << "the drained node did not exit";
  EXPECT_LE(std::abs(r.exit_s - sim_left), 0.5 + 0.15 * (sim_left - r.at_s));
  EXPECT_EQ(r.workers_after, 2u);
}

}  // namespace
}  // namespace troupe::test
