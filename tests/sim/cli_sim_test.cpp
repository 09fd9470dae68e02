// Black-box tests of `troupe profile` and `troupe simulate`: real processes,
// real files. The profile of the tiny model is made once per test process.
#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cluster/sim/cost_profile.hpp"
#include "cluster/sim/head_cost.hpp"
#include "cluster/sim/plots.hpp"
#include "sim_test_utils.hpp"
#include "test_utils.hpp"

namespace {

using nlohmann::json;
using troupe::test::run_command;
using troupe::test::shell_quote;
using troupe::test::TempDir;
namespace sim = troupe::cluster::sim;

std::string tcmd(const std::string& args) { return shell_quote(troupe::test::troupe_bin()) + " " + args; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Fixture {
  TempDir dir;
  std::string model = dir.file("tiny"), cost = dir.file("cost.json"), profile_output;
  Fixture() {
    auto r = run_command(tcmd("init-model --preset tiny --seed 7 --out " + shell_quote(model) +
                              " --tokenizer " + shell_quote(troupe::test::tokenizer_dir())));
    if (r.status != 0) throw std::runtime_error("init-model failed: " + r.output);
    r = run_command(
        tcmd("profile --model " + shell_quote(model) + " --quick --quiet --out " + shell_quote(cost)));
    if (r.status != 0) throw std::runtime_error("profile failed: " + r.output);
    profile_output = r.output;
  }
};

const Fixture& fx() {
  static Fixture f;
  return f;
}

std::string sim_args(const std::string& extra) {
  return "simulate --quiet --cost " + shell_quote(fx().cost) + " " + extra;
}

TEST(CliProfile, QuickProfileOfTheTinyModelIsAValidCostFile) {
  const sim::CostProfile p = sim::read_cost_profile(fx().cost);
  EXPECT_EQ(p.model.n_layer, 2);
  EXPECT_EQ(p.model.n_embd, 64);
  EXPECT_EQ(p.model.n_positions, 128);
  EXPECT_EQ(p.model.vocab_size, 50257);
  EXPECT_EQ(p.device, "cpu");
  EXPECT_FALSE(p.processor.empty());
  EXPECT_GE(p.threads, 1);
  EXPECT_EQ(p.block_size, 16);
  EXPECT_EQ(p.kv_bytes_per_token, 2 * 2 * 64 * 4);  // K and V, 2 layers, 64 wide, fp32
  EXPECT_EQ(p.libraries.count("torch"), 1u);
  EXPECT_GE(p.fit_points.size(), 20u);
  EXPECT_EQ(p.heldout_points.size(), 8u);
  EXPECT_EQ(p.heldout_error.points, 8u);
  for (const auto& m : p.fit_points) {
    EXPECT_EQ(m.reps_ns.size(), 3u);
    EXPECT_GT(m.sample.ns, 0);
    EXPECT_GE(m.sample.shape.tokens, 1);
    EXPECT_LE(m.sample.shape.tokens, 256);
    EXPECT_GT(p.cost.predict_ns(m.sample.shape), 0);
  }
  EXPECT_NE(fx().profile_output.find("held-out error"), std::string::npos) << fx().profile_output;
  // Chunks that continue a prompt are in the grid, alone and beside decodes:
  // more attention pairs than the same tokens from position 0, so the fit can
  // price a pair apart from a token.
  int continuing = 0, continuing_with_decodes = 0;
  for (const auto& m : p.fit_points) {
    const int64_t n = m.prefill_tokens, from_zero = n * (n + 1) / 2;
    if (m.prefill_seqs != 1 || m.sample.shape.prefill_pairs <= from_zero) continue;
    ++continuing;
    if (m.decode_seqs > 0) ++continuing_with_decodes;
  }
  EXPECT_GE(continuing, 4);
  EXPECT_GE(continuing_with_decodes, 2);
}

TEST(CliProfile, RefitMeasuresNothingNew) {
  TempDir d;
  auto r = run_command(tcmd("profile --refit " + shell_quote(fx().cost) + " --stat median --out " +
                            shell_quote(d.file("m.json"))));
  ASSERT_EQ(r.status, 0) << r.output;
  const sim::CostProfile a = sim::read_cost_profile(fx().cost), b = sim::read_cost_profile(d.file("m.json"));
  EXPECT_EQ(a.stat, sim::RepStat::kMin);
  EXPECT_EQ(b.stat, sim::RepStat::kMedian);
  ASSERT_EQ(a.fit_points.size(), b.fit_points.size());
  for (size_t i = 0; i < a.fit_points.size(); ++i)
    EXPECT_EQ(a.fit_points[i].reps_ns, b.fit_points[i].reps_ns);
  EXPECT_NE(r.output.find("median of 3 runs"), std::string::npos) << r.output;
}

TEST(CliProfile, Errors) {
  TempDir d;
  auto r = run_command(tcmd("profile --quick --out " + shell_quote(d.file("c.json"))));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--model"), std::string::npos) << r.output;
  r = run_command(tcmd("profile --model /nonexistent --quick --out " + shell_quote(d.file("c.json"))));
  EXPECT_EQ(r.status, 1);
  EXPECT_FALSE(std::filesystem::exists(d.file("c.json")));
}

// A real head (troupe serve) with emulated workers under load: its CPU per
// event, in the file that simulate --head-cost charges to a simulated head.
TEST(CliProfile, HeadProfileOfARealHeadThatTheSimulatorCharges) {
  TempDir d;
  const std::string out = d.file("head.json"), j = d.file("sim.json");
  auto r = run_command(tcmd("profile --head --model " + shell_quote(fx().model) + " --emulate " +
                            shell_quote(fx().cost) + " --workers 2 --seconds 0.3 --quiet --out " + shell_quote(out)));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("per step result"), std::string::npos) << r.output;
  const sim::HeadProfile p = sim::read_head_profile(out);
  ASSERT_EQ(p.runs.size(), 6u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_GT(p.runs[i].requests, 0) << i;
    EXPECT_GE(p.runs[i].steps, p.runs[i].requests / 8) << i;  // at most 8 requests start in one step here
    EXPECT_GE(p.runs[i].tokens, p.runs[i].requests * p.runs[i].output_len / 2) << i;  // outputs of +-50%
    EXPECT_GT(p.runs[i].cpu_s, 0) << i;
  }
  EXPECT_EQ(p.runs[5].requests, 0);  // the idle run
  EXPECT_GT(p.cost.request_ns + p.cost.step_ns + p.cost.token_ns, 0);
  r = run_command(tcmd(sim_args("--workers 2 --num-requests 40 --random-input-len 32 --random-output-len 8 "
                                "--head-cost " + shell_quote(out) + " --json " + shell_quote(j))));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("head: utilisation"), std::string::npos) << r.output;
  const json s = json::parse(read_file(j));
  EXPECT_GT(s["head"]["utilization"].get<double>(), 0);
  EXPECT_LE(s["head"]["utilization"].get<double>(), 1.0);
  EXPECT_EQ(s["simulation"]["head_cost"]["file"], out);
  // A worker's cost profile is not a head's; --head needs the workers' profile.
  r = run_command(tcmd(sim_args("--workers 2 --num-requests 4 --head-cost " + shell_quote(fx().cost))) + " 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("troupe-head-profile"), std::string::npos) << r.output;
  r = run_command(tcmd("profile --head --model " + shell_quote(fx().model) + " --out " + shell_quote(out)) + " 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--emulate"), std::string::npos) << r.output;
}

TEST(CliSimulate, SameInputsGiveTheSameBytes) {
  TempDir d;
  const std::string args =
      "--workers 2 --request-rate 20 --num-requests 60 --random-input-len 40 "
      "--random-output-len 12 --range-ratio 0.5 --seed 3 --goodput ttft:50 tpot:20 "
      "--net-latency-us 200 --net-bandwidth-gbps 1 --json ";
  auto a = run_command(
      tcmd(sim_args(args + shell_quote(d.file("a.json")) + " --step-log " + shell_quote(d.file("a.jsonl")))));
  ASSERT_EQ(a.status, 0) << a.output;
  auto b = run_command(
      tcmd(sim_args(args + shell_quote(d.file("b.json")) + " --step-log " + shell_quote(d.file("b.jsonl")))));
  ASSERT_EQ(b.status, 0) << b.output;
  const std::string ja = read_file(d.file("a.json")), jb = read_file(d.file("b.json"));
  EXPECT_EQ(ja, jb);
  const std::string sa = read_file(d.file("a.jsonl"));
  EXPECT_EQ(sa, read_file(d.file("b.jsonl")));
  int64_t steps = 0;
  const json parsed = json::parse(ja);
  for (const auto& w : parsed["workers"]) steps += w["steps"].get<int64_t>();
  EXPECT_EQ(std::count(sa.begin(), sa.end(), '\n'), steps) << "one line a step";
  auto c = run_command(tcmd(
      sim_args("--workers 2 --request-rate 20 --num-requests 60 --random-input-len 40 --random-output-len 12 "
               "--range-ratio 0.5 --seed 4 --goodput ttft:50 tpot:20 --net-latency-us 200 "
               "--net-bandwidth-gbps 1 --json " +
               shell_quote(d.file("c.json")))));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(read_file(d.file("c.json")), ja);  // the seed matters

  const json j = json::parse(ja);
  for (const char* k : {"completed",
                        "total_input_tokens",
                        "total_output_tokens",
                        "request_throughput",
                        "output_throughput",
                        "total_token_throughput",
                        "request_goodput",
                        "mean_ttft_ms",
                        "median_ttft_ms",
                        "p90_ttft_ms",
                        "p99_ttft_ms",
                        "mean_tpot_ms",
                        "p99_tpot_ms",
                        "mean_itl_ms",
                        "mean_e2el_ms",
                        "duration",
                        "ttfts",
                        "workers",
                        "series",
                        "simulation",
                        "mean_queue_ms"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["completed"], 60);
  int64_t out = 0;
  for (const auto& n : j["output_lens"]) {
    EXPECT_GE(n.get<int>(), 6);  // 12 with range ratio 0.5
    EXPECT_LE(n.get<int>(), 18);
    out += n.get<int>();
  }
  EXPECT_EQ(j["total_output_tokens"], out);
  EXPECT_EQ(j["workers"].size(), 2u);
  EXPECT_EQ(j["simulation"]["workers"], 2);
  EXPECT_NE(a.output.find("Simulation Result"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("Mean TTFT (ms):"), std::string::npos);
}

TEST(CliSimulate, CsvAndPlots) {
  TempDir d;
  std::string extra;
  const bool plots = !sim::find_gnuplot().empty();
  if (plots) extra = " --plot " + shell_quote(d.file("plots"));
  auto r =
      run_command(tcmd(sim_args("--workers 1 --request-rate 10 --num-requests 30 --random-input-len 20 "
                                "--random-output-len 8 --sample-interval 0.2 --csv " +
                                shell_quote(d.file("csv")) + extra)));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* f : {"series.csv", "workers.csv", "requests.csv"}) {
    const std::string text = read_file(d.file("csv/") + f);
    EXPECT_FALSE(text.empty()) << f;
  }
  std::istringstream req(read_file(d.file("csv/requests.csv")));
  std::string line;
  int lines = 0;
  while (std::getline(req, line)) ++lines;
  EXPECT_EQ(lines, 31);  // header + one row per request
  if (!plots) GTEST_SKIP() << "gnuplot is not installed: plots not checked";
  for (const char* f : {"latency_cdf", "throughput_queue", "kv_use"}) {
    for (const char* ext : {".png", ".svg"}) {
      const std::string p = d.file("plots/") + f + ext;
      ASSERT_TRUE(std::filesystem::exists(p)) << p;
      EXPECT_GT(std::filesystem::file_size(p), 1000u) << p;
    }
  }
}

TEST(CliSimulate, SweepAndFindWorkers) {
  TempDir d;
  auto r =
      run_command(tcmd(sim_args("--workers 1 --num-requests 40 --random-input-len 20 --random-output-len 8 "
                                "--sweep rate=5:45:20 --goodput e2el:100000 --json " +
                                shell_quote(d.file("sweep.json")))));
  ASSERT_EQ(r.status, 0) << r.output;
  const json s = json::parse(read_file(d.file("sweep.json")));
  ASSERT_EQ(s["sweep"].size(), 3u);
  EXPECT_EQ(s["sweep"][2]["request_rate"], 45.0);
  EXPECT_EQ(s["highest_rate_meeting_slo"], 45.0);  // a 100 s E2EL target is met everywhere
  EXPECT_NE(r.output.find("highest rate meeting the SLOs"), std::string::npos) << r.output;

  r = run_command(
      tcmd(sim_args("--request-rate 200 --num-requests 200 --random-input-len 60 --random-output-len 16 "
                    "--find-workers --max-workers 64 --goodput ttft:1 --json " +
                    shell_quote(d.file("fw.json")))));
  ASSERT_EQ(r.status, 0) << r.output;
  const json w = json::parse(read_file(d.file("fw.json")));
  ASSERT_FALSE(w["find_workers"].empty());
  // Whatever the answer, the search's rows agree with it: fewer workers fail, the answer meets.
  if (!w["fewest_workers"].is_null()) {
    const int fewest = w["fewest_workers"];
    for (const auto& row : w["find_workers"])
      EXPECT_EQ(row["meets_slo"].get<bool>(), row["workers"] >= fewest) << row;
  }
}

TEST(CliSimulate, TraceReplay) {
  TempDir d;
  auto r = run_command(tcmd(
      sim_args("--workers 2 --trace " + shell_quote(sim::test::fixture("mooncake.jsonl")) +
               " --trace-format mooncake --trace-block-tokens 16 --json " + shell_quote(d.file("m.json")))));
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = json::parse(read_file(d.file("m.json")));
  EXPECT_EQ(j["completed"], 4);
  EXPECT_GT(j["clipped_requests"].get<int>(), 0);  // 600-1300 token prompts on a 128-position model
  r = run_command(tcmd(
      sim_args("--trace " + shell_quote(sim::test::fixture("azure_bad.csv")) + " --trace-format azure")));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("azure_bad.csv:5:"), std::string::npos) << r.output;
}

TEST(CliSimulate, CostScaleMultipliesEveryStepTime) {
  // All requests at once: no arrival falls between steps, so the schedule is
  // the same whatever the step times, and every latency scales with them.
  TempDir d;
  const std::string args =
      "--workers 1 --num-requests 24 --random-input-len 30 --random-output-len 10 "
      "--range-ratio 0.5 --seed 5 --json ";
  auto r = run_command(tcmd(sim_args(args + shell_quote(d.file("a.json")))));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_command(tcmd(sim_args(args + shell_quote(d.file("b.json")) + " --cost-scale 2.5")));
  ASSERT_EQ(r.status, 0) << r.output;
  const json a = json::parse(read_file(d.file("a.json"))), b = json::parse(read_file(d.file("b.json")));
  EXPECT_EQ(a["simulation"]["cost_scale"], 1.0);
  EXPECT_EQ(b["simulation"]["cost_scale"], 2.5);
  EXPECT_EQ(a["completed"], b["completed"]);
  for (const char* k : {"median_ttft_ms", "median_tpot_ms", "p99_itl_ms", "mean_e2el_ms", "duration"})
    EXPECT_NEAR(b[k].get<double>(), 2.5 * a[k].get<double>(), 1e-4 * a[k].get<double>()) << k;
  EXPECT_NEAR(b["output_throughput"].get<double>(), a["output_throughput"].get<double>() / 2.5,
              1e-4 * a["output_throughput"].get<double>());
}

// --fail-worker / --hang-worker / --drain-worker: the faults' section of the
// report, the same bytes again for the same inputs.
TEST(CliSimulate, FaultsAreReportedAndDeterministic) {
  TempDir d;
  const std::string args =
      "--workers 4 --request-rate 40 --num-requests 120 --random-input-len 40 --random-output-len 24 --seed 2 "
      "--fail-worker 1@0.5 --hang-worker 2@0.7 --drain-worker 3@5 --json ";
  auto a = run_command(tcmd(sim_args(args + shell_quote(d.file("a.json")))));
  ASSERT_EQ(a.status, 0) << a.output;
  auto b = run_command(tcmd(sim_args(args + shell_quote(d.file("b.json")))));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_EQ(read_file(d.file("a.json")), read_file(d.file("b.json")));
  EXPECT_NE(a.output.find("Faults"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("kill  worker 1 at 0.500 s: gone at 3.500 s"), std::string::npos)
      << a.output << "noticed after 3 missed heartbeats of 1 s";
  const json j = json::parse(read_file(d.file("a.json")));
  ASSERT_EQ(j["faults"].size(), 3u);
  EXPECT_EQ(j["faults"][1]["kind"], "hang");
  EXPECT_GT(j["faults"][1]["removed_s"].get<double>(), 0.7 + 4.9) << "the step deadline's 5 s floor";
  EXPECT_EQ(j["requests_moved"].get<int64_t>(),
            j["faults"][0]["requests_moved"].get<int64_t>() + j["faults"][1]["requests_moved"].get<int64_t>() +
                j["faults"][2]["requests_moved"].get<int64_t>());
  EXPECT_EQ(j["affected"]["requests"].get<int64_t>() + j["unaffected"]["requests"].get<int64_t>(), 120);
  EXPECT_EQ(j["completed"].get<int64_t>(), 120);
}

// --events: a file of the same faults as the flags gives the same run, byte
// for byte; an add and cuts (one short, one past the liveness window) are
// reported with the workers that joined, and the same inputs give the same bytes.
TEST(CliSimulate, AnEventsFileGivesWhatTheFlagsGive) {
  TempDir d;
  const std::string args =
      "--workers 4 --net-latency-us 50 --request-rate 40 --num-requests 120 --random-input-len 40 "
      "--random-output-len 24 --seed 2 ";
  std::ofstream(d.file("events.yaml")) << "events:\n  - {at: 0.5, kill: 1}\n  - {at: 0.7, hang: 2}\n"
                                          "  - {at: 5, drain: 3}\n";
  auto a = run_command(tcmd(sim_args(args + "--json " + shell_quote(d.file("a.json")) +
                                     " --fail-worker 1@0.5 --hang-worker 2@0.7 --drain-worker 3@5")));
  ASSERT_EQ(a.status, 0) << a.output;
  auto b = run_command(tcmd(sim_args(args + "--json " + shell_quote(d.file("b.json")) + " --events " +
                                     shell_quote(d.file("events.yaml")))));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_EQ(read_file(d.file("a.json")), read_file(d.file("b.json")));
  EXPECT_EQ(json::parse(read_file(d.file("a.json")))["faults"].size(), 3u);

  std::ofstream(d.file("more.yaml")) << "events:\n  - {at: 0.3, add: {node: worker}}\n"
                                        "  - {at: 0.5, cut: 2, for: 1.2}\n  - {at: 0.6, cut: 3, for: 0.5}\n";
  const std::string more = args + "--heartbeat-ms 300 --events " + shell_quote(d.file("more.yaml")) +
                           " --json ";  // lost after 0.9 s
  auto c = run_command(tcmd(sim_args(more + shell_quote(d.file("c.json")))));
  ASSERT_EQ(c.status, 0) << c.output;
  auto c2 = run_command(tcmd(sim_args(more + shell_quote(d.file("c2.json")))));
  ASSERT_EQ(c2.status, 0) << c2.output;
  EXPECT_EQ(read_file(d.file("c.json")), read_file(d.file("c2.json")));
  const json j = json::parse(read_file(d.file("c.json")));
  EXPECT_EQ(j["completed"], 120);
  ASSERT_EQ(j["workers"].size(), 6u) << "4, the one added, and worker 2's node registered again";
  ASSERT_EQ(j["faults"].size(), 3u);
  EXPECT_EQ(j["faults"][0]["kind"], "add");
  EXPECT_EQ(j["faults"][0]["worker"], 5);
  EXPECT_EQ(j["faults"][0]["node"], "worker");
  EXPECT_EQ(j["faults"][1]["kind"], "cut");
  EXPECT_DOUBLE_EQ(j["faults"][1]["removed_s"].get<double>(), 1.4)
      << "the cut + 3 missed heartbeats of 0.3 s";
  EXPECT_DOUBLE_EQ(j["faults"][1]["returned_s"].get<double>(), 1.7);
  EXPECT_EQ(j["faults"][1]["new_worker"], 6);
  EXPECT_GT(j["faults"][1]["requests_moved"].get<int>(), 0);
  EXPECT_TRUE(j["faults"][2]["removed_s"].is_null()) << "a short cut only delays";
  EXPECT_EQ(j["faults"][2]["requests_moved"], 0);
  EXPECT_DOUBLE_EQ(j["faults"][2]["for_s"].get<double>(), 0.5);
  EXPECT_NE(
      c.output.find(
          "cut   worker 2 at 0.500 s: link down for 1.200 s, gone at 1.400 s, back as worker 6 at 1.700 s"),
      std::string::npos)
      << c.output;

  std::ofstream(d.file("bad.yaml")) << "events:\n  - {at: 1, kill: 2}\n  - {at: 2, cut: 1, fro: 3}\n";
  auto e = run_command(tcmd(sim_args("--events " + shell_quote(d.file("bad.yaml")))));
  EXPECT_EQ(e.status, 1) << e.output;
  EXPECT_NE(e.output.find("events[1]: unknown key 'fro'"), std::string::npos) << e.output;
  std::ofstream(d.file("local.yaml")) << "events:\n  - {at: 1, cut: 1, for: 1}\n";
  e = run_command(tcmd(sim_args("--workers 2 --events " + shell_quote(d.file("local.yaml")))));
  EXPECT_EQ(e.status, 2) << e.output;
  EXPECT_NE(e.output.find("no link to cut"), std::string::npos) << e.output;
}

TEST(CliSimulate, Errors) {
  auto expect = [](const std::string& args, int status, const std::string& what) {
    auto r = run_command(tcmd(args));
    EXPECT_EQ(r.status, status) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << args << "\n" << r.output;
  };
  expect("simulate --num-requests 5", 2, "--cost");
  expect(sim_args("--goodput ttft"), 2, "ttft");
  expect(sim_args("--sweep rate=5:1:1"), 2, "--sweep");
  expect(sim_args("--sweep rate=1:5:1 --step-log /tmp/never-written.jsonl"), 2, "--step-log");
  expect(sim_args("--step-log /nonexistent/steps.jsonl"), 2, "cannot write");
  expect(sim_args("--placement random"), 2, "placement");
  expect(sim_args("--block-size 32"), 2, "block size");
  expect(sim_args("--trace-format azure"), 2, "--trace");
  expect(sim_args("--input-len-dist gauss:3"), 2, "gauss:3");
  expect("simulate --cost /nonexistent/cost.json", 1, "troupe profile");
  expect(sim_args("--fail-worker 2"), 2, "WORKER@SECONDS");
  expect(sim_args("--workers 2 --hang-worker 3@1"), 2, "worker 3 of 2");
  for (const char* bad : {"0", "-1", "nan", "inf"})
    expect(sim_args(std::string("--num-requests 3 --cost-scale ") + bad), 2,
           "--cost-scale must be a finite number > 0");
}

}  // namespace
