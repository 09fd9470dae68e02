// A node struck under load, served and simulated: a real head with three
// emulated workers (one per node, round-robin placement, so request i lands
// on the same worker in both) and `troupe bench` sending a seeded workload;
// node n2 is killed (SIGKILL), drained (SIGTERM), hung (its `worker.step`
// failpoint) or cut off (its network namespace's link down for 4 s) about 5 s
// in, or joins then (the cluster had two). `troupe simulate` of the same
// workload with the same event at the same time must cost what the served run
// cost: the same requests moved and tokens recomputed (within 15%, and a
// request's worth at this small scale), for a drain the node gone when the
// simulation lets it go, for a join the new worker's share of the tokens.
// (The tables at 8 workers: docs/benchmarks.md, bench/bench_fault_fidelity.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
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
  double n2_tokens = 0;          // output tokens of node n2's worker(s), at the head
  double back_s = -1;            // cut: when n2 registered again; -1: it did not
  nlohmann::json sim;            // the simulation's report
};

json simulate(const TempDir& dir, const std::string& cost, const std::string& fault, const std::string& name,
              int workers = 3) {
  auto r = run_command(shell_quote(bin()) + " simulate --cost " + shell_quote(cost) + " --workers " +
                       std::to_string(workers) + " --num-blocks 256 --placement round-robin --quiet" +
                       kWorkload + " " + fault + " --json " + shell_quote(dir.file(name)));
  EXPECT_EQ(r.status, 0) << r.output;
  return json::parse(std::ifstream(dir.file(name)));
}

// An events file (docs/simulation.md) holding one event.
std::string events_file(const TempDir& dir, const std::string& event) {
  const std::string path = dir.file("events.yaml");
  std::ofstream(path) << "events:\n  - " << event << "\n";
  return path;
}

// kind: "kill" (SIGKILL at 5 s), "drain" (SIGTERM at 5 s), "hang" (the node's
// step near 5 s hangs; the time it fired read from its log), "cut" (the link of
// n2's namespace down from 5 s for 4 s; `ns` its namespace) or "add" (n2
// starts at 5 s; the time it registered read from the head's status).
FaultRun serve_and_simulate(const TempDir& dir, const std::string& kind, const NetNs* ns = nullptr) {
  FaultRun run;
  // 10 ms for a one-token step, 14 ms for 64 tokens
  const std::string cost = made_up_profile(dir, {1, 64}, {10e6, 14e6});
  std::vector<std::string> victim_env;
  // The workload's first arrival (the bench sends it that long after it starts).
  const json plain = simulate(dir, cost, "", "plain.json");
  const auto starts = plain["start_times"].get<std::vector<double>>();
  const double first_arrival = starts.empty() ? 0 : *std::min_element(starts.begin(), starts.end());
  if (kind == "hang") {
    // The step the victim runs near 5 s, at the simulated mean step rate.
    double steps = 0;
    for (const auto& w : plain["workers"]) steps += w["steps"].get<double>() / 3;
    const long k = std::lround(5 * steps / plain["duration"].get<double>());
    victim_env = {"env", "TROUPE_FAILPOINTS=worker.step=hang@" + std::to_string(k)};
  }
  std::vector<std::string> head_flags = {"--workers", "0", "--placement", "round-robin"};
  std::vector<std::string> n2_flags = {"--workers", "1", "--emulate", cost};
  if (kind == "cut") {
    // Every node joins at the host's end of the namespace's pair; n2 from inside it, so that link is its own.
    head_flags.insert(head_flags.end(), {"--worker-listen", "tcp://" + ns->host_ip + ":*", "--insecure"});
    victim_env = {"ip", "netns", "exec", ns->name};
    n2_flags.insert(n2_flags.end(), {"--join-timeout", "0"});  // it keeps trying to come back
  }
  Head head(dir, "head", head_flags);
  std::vector<std::unique_ptr<Process>> nodes;
  const auto start_n2 = [&] { return start_worker(dir, head, "n2", n2_flags, victim_env); };
  for (int i = 0; i < 3; ++i) {
    if (i == 2 && kind == "add") break;
    nodes.push_back(
        i == 2 ? start_n2()
               : start_worker(dir, head, "n" + std::to_string(i), {"--workers", "1", "--emulate", cost}));
    EXPECT_TRUE(head.wait_workers(static_cast<size_t>(i + 1))) << head.proc->log();  // joined in this order
  }
  const auto st = head.status();
  EXPECT_TRUE(st);
  if (!st) return run;
  uint32_t victim = 0, n2_id = 0;  // n2's worker: its place among the ids (the simulation's id), its id
  std::vector<uint32_t> ids;
  for (const auto& w : st->workers) ids.push_back(w.id);
  std::sort(ids.begin(), ids.end());
  for (const auto& w : st->workers)
    if (w.node == "n2") {
      victim = static_cast<uint32_t>(std::find(ids.begin(), ids.end(), w.id) - ids.begin()) + 1;
      n2_id = w.id;
    }
  EXPECT_TRUE(victim > 0 || kind == "add");
  Process bench({"/bin/sh", "-c",
                 shell_quote(bin()) + " bench --to " + head.listen + kWorkload + " --json " +
                     shell_quote(dir.file("bench.json"))},
                dir.file("bench.log"));
  // Times are the bench's: its start is its first request's arrival at the head
  // less the workload's first arrival (the process itself takes ~1 s to start).
  auto t0 = std::chrono::steady_clock::now();
  const bool sent = eventually(
      [&] {
        const auto s = head.status();
        return (s && s->requests_running + s->requests_served > 0) || !bench.running();
      },
      seconds(60), std::chrono::milliseconds(5));
  EXPECT_TRUE(sent && bench.running()) << bench.log();
  t0 = std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                              std::chrono::duration<double>(first_arrival));
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
  } else if (kind == "add") {
    std::this_thread::sleep_for(seconds(5));
    nodes.push_back(start_n2());
    const bool joined = eventually(
        [&] {
          const auto s = head.status();
          return (s && s->workers.size() == 3) || !bench.running();
        },
        seconds(30), std::chrono::milliseconds(10));
    run.at_s = since();
    EXPECT_TRUE(joined && bench.running()) << nodes[2]->log();
  } else if (kind == "cut") {
    std::this_thread::sleep_for(seconds(5));
    run.at_s = since();
    EXPECT_EQ(run_command("ip link set " + ns->host_if + " down").status, 0);
    std::this_thread::sleep_for(seconds(4));
    EXPECT_EQ(run_command("ip link set " + ns->host_if + " up").status, 0);
  } else {
    std::this_thread::sleep_for(seconds(5));
    run.at_s = since();
    nodes[2]->signal(kind == "kill" ? SIGKILL : SIGTERM);
    if (kind == "drain" && eventually([&] { return !nodes[2]->running(); }, seconds(60)))
      run.exit_s = since();
  }
  const auto n2_registered = [&] {
    const auto s = head.status();
    if (!s) return false;
    for (const auto& w : s->workers)
      if (w.node == "n2" && w.id != n2_id) return true;
    return false;
  };
  if (kind == "cut" && eventually(n2_registered, seconds(60), std::chrono::milliseconds(50)))
    run.back_s = since();
  EXPECT_EQ(bench.wait(seconds(300)), std::optional<int>(0)) << bench.log();
  const auto after = head.status();
  EXPECT_TRUE(after);
  if (after) {
    run.moved = static_cast<double>(after->requests_moved);
    run.tokens = static_cast<double>(after->tokens_recomputed);
    run.workers_after = after->workers.size();
    for (const auto& w : after->workers)
      if (w.node == "n2") run.n2_tokens += static_cast<double>(w.tokens);
  }
  run.completed = json::parse(std::ifstream(dir.file("bench.json")))["completed"].get<int>();
  char at[32];
  std::snprintf(at, sizeof at, "%.3f", run.at_s);
  if (kind == "add") {
    run.sim = simulate(dir, cost,
                       "--events " + events_file(dir, std::string("{at: ") + at + ", add: {node: worker}}"),
                       "sim.json", 2);
  } else if (kind == "cut") {
    // A cut needs a link: loopback's one-way latency (~30 us) for every worker.
    run.sim = simulate(
        dir, cost,
        "--net-latency-us 30 --events " +
            events_file(dir, "{at: " + std::string(at) + ", cut: " + std::to_string(victim) + ", for: 4}"),
        "sim.json");
  } else {
    const std::string flag = kind == "kill"    ? "--fail-worker"
                             : kind == "drain" ? "--drain-worker"
                                               : "--hang-worker";
    // (A hung node, reset by the head, registers again with a fresh worker; the
    // simulator does that itself: its report names the new worker.)
    run.sim = simulate(dir, cost, flag + " " + std::to_string(victim) + "@" + at, "sim.json");
  }
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

// The head hears nothing from the node for the liveness window (3 heartbeats)
// and lets its worker go, as for a kill; when the link is back the node
// registers again under a new id (the simulation's at the cut's end; the real
// one after its own silence check and TCP's retransmission backoff: reported,
// held to a few seconds).
TEST(Cluster, ACutLinkCostsWhatTheSimulationSays) {
  if (getuid() != 0) GTEST_SKIP() << "network namespaces need root; not run";
  TempDir dir;
  NetNs ns(93);
  if (!ns.ok) GTEST_SKIP() << "cannot make a network namespace here: " << ns.why_not;
  const FaultRun r = serve_and_simulate(dir, "cut", &ns);
  const json& fault = r.sim["faults"][0];
  ASSERT_FALSE(fault["removed_s"].is_null()) << fault.dump();
  EXPECT_NEAR(fault["removed_s"].get<double>(), r.at_s + 3, 0.01) << "cut + the liveness window";
  EXPECT_GT(r.sim["requests_moved"].get<double>(), 0);
  expect_moves_as_simulated(r, "cut off");
  std::printf("link down at %.3f s for 4 s: n2 registered again at %.3f s; simulated at %.3f s\n", r.at_s,
              r.back_s, fault["returned_s"].get<double>());
  ASSERT_GT(r.back_s, 0) << "n2 did not come back";
  EXPECT_GE(r.back_s, r.at_s + 4 - 0.1) << "not before its link was back";
  EXPECT_LE(r.back_s, fault["returned_s"].get<double>() + 5) << "the reconnect after a link is back";
  EXPECT_EQ(r.workers_after, 3u);
}

// A node joins mid-run: the requests sent after it registered take it in
// their turn (round-robin), so its share of the output tokens is the
// simulation's, and nothing moves.
TEST(Cluster, AJoiningNodeTakesTheShareTheSimulationSays) {
  TempDir dir;
  const FaultRun r = serve_and_simulate(dir, "add");
  ASSERT_EQ(r.sim["workers"].size(), 3u);
  const double sim_tokens = r.sim["workers"][2]["tokens_generated"].get<double>();
  std::printf("node joined at %.3f s: it generated %.0f tokens; simulated %.0f\n", r.at_s, r.n2_tokens,
              sim_tokens);
  EXPECT_GT(sim_tokens, 0);
  EXPECT_LE(std::abs(r.n2_tokens - sim_tokens), 90 + 0.15 * sim_tokens) << "a request's output and 15%";
  EXPECT_EQ(r.moved, 0);
  EXPECT_EQ(r.sim["requests_moved"].get<double>(), 0);
  EXPECT_EQ(r.completed, 90) << "nothing lost";
  EXPECT_EQ(r.workers_after, 3u);
}

}  // namespace
}  // namespace troupe::test
