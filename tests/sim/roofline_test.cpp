// Roofline cost profiles: the shipped specs parse and cite, a step's time is
// the larger of its FLOPs and bytes at the spec's achievable rates plus the
// overheads, the fitted profile follows the roofline and runs in the
// simulator, and the check against measured steps reads the H200's CSV.
#include "cluster/sim/roofline.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cluster/sim/simulator.hpp"
#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

const std::string kSpecs = std::string(TROUPE_PROFILES_DIR) + "/specs";

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

RooflineSpec simple() {
  RooflineSpec s;
  s.name = "test";
  s.fp32_tflops = 10;
  s.bf16_tflops = 100;
  s.memory_gbs = 1000;
  s.compute_efficiency = 0.5;
  s.bandwidth_efficiency = 0.8;
  s.step_overhead_us = 3;
  s.layer_overhead_us = 2;
  s.sources = {"made up"};
  return s;
}

TEST(Roofline, ShippedSpecsParseAndCiteTheirNumbers) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(kSpecs)) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    const RooflineSpec s = read_roofline_spec(e.path().string());
    EXPECT_FALSE(s.name.empty());
    EXPECT_FALSE(s.sources.empty());
    EXPECT_GT(s.memory_gbs, 0);
    EXPECT_GT(s.compute_efficiency, 0);
    EXPECT_LE(s.bandwidth_efficiency, 1);
    ++n;
  }
  EXPECT_GE(n, 5u) << "A100, H100, H200, L4 and this CPU";
}

TEST(Roofline, BadSpecsNameTheField) {
  const std::string dir = testing::TempDir();
  auto expect = [&](const std::string& text, const std::string& what) {
    const std::string path = write(dir + "/spec.yaml", text);
    try {
      read_roofline_spec(path);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const std::string ok =
      "name: x\nfp32_tflops: 1\nmemory_gbs: 10\ncompute_efficiency: 0.5\nbandwidth_efficiency: 0.5\n";
  expect(ok, "sources");
  expect(ok + "sources: [a]\nturbo: 2\n", "unknown field 'turbo'");
  expect("name: x\nmemory_gbs: 10\ncompute_efficiency: 0.5\nbandwidth_efficiency: 0.5\nsources: [a]\n",
         "'fp32_tflops' is missing");
  expect(ok + "sources: [a]\nstep_overhead_us: -1\n", "step_overhead_us");
  expect("name: x\nfp32_tflops: 1\nmemory_gbs: 10\ncompute_efficiency: 1.5\nbandwidth_efficiency: 0.5\nsources: [a]\n",
         "compute_efficiency");
  EXPECT_EQ(read_roofline_spec(write(dir + "/good.yaml", ok + "sources: [a]\n")).name, "x");
}

TEST(Roofline, AStepTakesTheLongerOfItsFlopsAndBytesPlusTheOverheads) {
  const RooflineSpec s = simple();
  const ModelShape m;  // GPT-2 124M
  const double overhead_ns = (3 + 2 * 12) * 1e3;
  // Batch-1 decode: memory-bound.
  StepShape decode;
  decode.add(100, 1, true);
  const StepWork wd = roofline_work(m, "float32", decode);
  EXPECT_GT(wd.bytes / (1000e9 * 0.8), wd.flops / (10e12 * 0.5));
  EXPECT_NEAR(roofline_ns(s, m, "float32", decode), wd.bytes / (1000e9 * 0.8) * 1e9 + overhead_ns, 1);
  // Its weights (124M parameters of 4 bytes) and a little more (one token's K/V, activations, logits).
  EXPECT_GT(wd.bytes, 4.0 * 124e6);
  EXPECT_LT(wd.bytes, 4.0 * 128e6);
  // bfloat16 halves the bytes.
  EXPECT_NEAR(roofline_work(m, "bfloat16", decode).bytes, wd.bytes / 2, wd.bytes * 0.01);
  // A long prefill: compute-bound, 2 x 12 E^2 L per token and more.
  StepShape prefill;
  prefill.add(0, 1024, true);
  const StepWork wp = roofline_work(m, "float32", prefill);
  EXPECT_GT(wp.flops, 2.0 * 12 * 768 * 768 * 12 * 1024);
  EXPECT_NEAR(roofline_ns(s, m, "float32", prefill), wp.flops / (10e12 * 0.5) * 1e9 + overhead_ns, 1);
  EXPECT_LT(roofline_ns(s, m, "bfloat16", prefill), roofline_ns(s, m, "float32", prefill) / 5);
  RooflineSpec no_bf16 = s;
  no_bf16.bf16_tflops = 0;
  EXPECT_THROW(roofline_ns(no_bf16, m, "bfloat16", prefill), std::invalid_argument);
  EXPECT_THROW(roofline_work(m, "int4", prefill), std::invalid_argument);
}

// int8 weights: a quarter of fp32's matrix bytes (and their scales), K/V and
// activations in bfloat16, the matrices' products at the int8 peak and
// attention at the bf16 one; a spec without an int8 peak refuses the dtype.
TEST(Roofline, Int8WeightsReadAQuarterOfTheMatricesAndMultiplyAtTheInt8Peak) {
  RooflineSpec s = simple();
  s.int8_tops = 400;
  const ModelShape m;  // GPT-2 124M: 85M in the blocks' matrices, 38.6M in wte
  StepShape decode;
  decode.add(100, 1, true);
  const StepWork f = roofline_work(m, "float32", decode), b = roofline_work(m, "bfloat16", decode),
                 q = roofline_work(m, "int8", decode), g = roofline_work(m, "int8_g32", decode);
  const double matrices = 12.0 * 768 * 768 * 12 + 50257.0 * 768;
  // bf16 and int8 differ only in the matrices' bytes: 2 vs 1 (+ an fp32 scale per output channel).
  EXPECT_NEAR(b.bytes - q.bytes, matrices - 4.0 * ((3 * 768 + 768 + 4 * 768 + 768) * 12 + 50257), 1.0);
  EXPECT_NEAR(g.bytes - q.bytes, matrices * 4.0 / 32 - 4.0 * ((3 * 768 + 768 + 4 * 768 + 768) * 12 + 50257), 1.0);
  EXPECT_EQ(q.flops, f.flops);
  EXPECT_EQ(q.matrix_flops, f.matrix_flops);
  EXPECT_LT(q.matrix_flops, q.flops);  // attention is the rest
  // Batch-1 decode reads the weights: int8 about half of bf16's time, a quarter of fp32's.
  const double overhead_ns = (3 + 2 * 12) * 1e3;
  EXPECT_NEAR(roofline_ns(s, m, "int8", decode), q.bytes / (1000e9 * 0.8) * 1e9 + overhead_ns, 1);
  // A long prefill is compute-bound: the matrices at 400 TOPS, attention at the bf16 100.
  StepShape prefill;
  prefill.add(0, 1024, true);
  const StepWork p = roofline_work(m, "int8", prefill);
  EXPECT_NEAR(roofline_ns(s, m, "int8", prefill),
              (p.matrix_flops / 400e12 + (p.flops - p.matrix_flops) / 100e12) / 0.5 * 1e9 + overhead_ns, 1);
  EXPECT_EQ(roofline_kv_dtype("int8"), "bfloat16");
  EXPECT_EQ(roofline_kv_dtype("float32"), "float32");
  RooflineSpec no_int8 = s;
  no_int8.int8_tops = 0;
  EXPECT_THROW(roofline_ns(no_int8, m, "int8_g32", prefill), std::invalid_argument);
  const CostProfile profile = roofline_profile(s, m, "int8");
  EXPECT_EQ(profile.dtype, "int8");
  EXPECT_EQ(profile.kv_cache_dtype, "bfloat16");
  EXPECT_EQ(profile.kv_bytes_per_token, 2 * 12 * 768 * 2);
  EXPECT_LT(profile.heldout_error.median_pct, 10);
  // The K/V in another dtype: its bytes, read and written, follow it.
  StepShape long_decode;
  for (int i = 0; i < 64; ++i) long_decode.add(900, 1, true);
  const double kv_fp32 = roofline_work(m, "int8", long_decode, "float32").bytes,
               kv_bf16 = roofline_work(m, "int8", long_decode).bytes;
  EXPECT_NEAR(kv_fp32 - kv_bf16, 64 * (901 + 1) * 2.0 * 12 * 768 * 2, 1.0);  // 901 positions read, 1 written
  EXPECT_EQ(roofline_profile(s, m, "int8", 16, 1, "float32").kv_bytes_per_token, 2 * 12 * 768 * 4);
}

TEST(Roofline, TheProfileFollowsTheRooflineAndRunsInTheSimulator) {
  const RooflineSpec s = read_roofline_spec(kSpecs + "/nvidia-h100-sxm.yaml");
  ModelShape xl;
  xl.n_layer = 48, xl.n_head = 25, xl.n_embd = 1600;
  for (const std::string dtype : {"float32", "bfloat16"}) {
    const CostProfile p = roofline_profile(s, xl, dtype);
    SCOPED_TRACE(dtype);
    EXPECT_EQ(p.dtype, dtype);
    EXPECT_EQ(p.kv_bytes_per_token, 2 * 48 * 1600 * (dtype == "float32" ? 4 : 2));
    EXPECT_NE(p.processor.find("prediction"), std::string::npos);
    EXPECT_LT(p.fit_error.median_pct, 5);
    EXPECT_LT(p.heldout_error.median_pct, 10);
    // Written and read back as any profile, then simulated.
    const std::string path = testing::TempDir() + "/roofline-" + dtype + ".json";
    write_cost_profile(path, p);
    const CostProfile q = read_cost_profile(path);
    SimOptions o;
    o.workers = {test::worker(std::make_shared<CostModel>(q.cost))};
    WorkloadRequest r;
    r.input_len = 200;
    r.output_len = 20;
    const SimResult res = simulate({r}, o);
    ASSERT_TRUE(res.requests[0].success);
    // 20 tokens of a 1.5B model: at least 20 reads of its weights at the bandwidth.
    const double weight_s = 1.56e9 * (dtype == "float32" ? 4 : 2) / (3350e9 * 0.88);
    EXPECT_GT(static_cast<double>(res.requests[0].end_ns) / 1e9, 19 * weight_s);
  }
}

TEST(Roofline, ChecksAgainstMeasuredSteps) {
  const auto steps = measured_steps_csv(std::string(TROUPE_PROFILES_DIR) + "/../../bench/data/h200/gpt2_steps.csv");
  ASSERT_GT(steps.size(), 100u);
  const RooflineSpec s = read_roofline_spec(kSpecs + "/nvidia-h200.yaml");
  bool graph = false;
  for (const auto& e : roofline_errors(s, steps)) {
    EXPECT_GT(e.points, 0u);
    graph |= e.step_class == "decode (CUDA graph)";
    if (e.step_class != "all") { EXPECT_LE(e.median_signed_pct, 5) << e.step_class << ": a roofline is a lower bound"; }
  }
  EXPECT_TRUE(graph);
  const std::string bad = write(testing::TempDir() + "/bad.csv", "model,dtype,kind,batch,tokens,context,graph,median_ms\n"
                                                                  "124M,float32,sideways,1,1,1,0,1\n");
  EXPECT_THROW(measured_steps_csv(bad), std::runtime_error);
}

}  // namespace
}  // namespace troupe::cluster::sim
