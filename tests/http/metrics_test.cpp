// Prometheus text output: histograms, the writer, and the collector that
// turns the router's replies and a status report into vLLM's metric set.
#include "cluster/http/metrics_collector.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cluster/http/prometheus.hpp"
#include "test_utils.hpp"

namespace troupe::cluster {
namespace {

constexpr int64_t kMs = 1'000'000;

// The value of one sample line "name{labels} value" (exact name and labels).
double sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no sample " << series;
    return -1;
  }
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(Prometheus, HistogramBucketsAreInclusiveAndCumulativeOnOutput) {
  Histogram h({0.25, 1.0});
  for (double v : {0.125, 0.25, 0.5, 2.0}) h.observe(v);
  EXPECT_EQ(h.counts(), (std::vector<uint64_t>{2, 1, 1}));
  EXPECT_EQ(h.count(), 4u);
  EXPECT_DOUBLE_EQ(h.sum(), 2.875);
  PrometheusWriter w;
  w.family("x_seconds", "histogram", "A \"test\"\\ histogram.");
  w.histogram("x_seconds", {{"model_name", "g\"2"}}, h);
  EXPECT_EQ(w.str(),
            "# HELP x_seconds A \"test\"\\\\ histogram.\n# TYPE x_seconds histogram\n"
            "x_seconds_bucket{model_name=\"g\\\"2\",le=\"0.25\"} 2\n"
            "x_seconds_bucket{model_name=\"g\\\"2\",le=\"1\"} 3\n"
            "x_seconds_bucket{model_name=\"g\\\"2\",le=\"+Inf\"} 4\n"
            "x_seconds_sum{model_name=\"g\\\"2\"} 2.875\n"
            "x_seconds_count{model_name=\"g\\\"2\"} 4\n");
  EXPECT_THROW(Histogram({1.0, 1.0}), std::invalid_argument);
}

TEST(Prometheus, ValuesAndBuckets) {
  EXPECT_EQ(format_value(3), "3");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(0.025), "0.025");
  EXPECT_EQ(format_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(format_value(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(format_value(std::nan("")), "NaN");
  EXPECT_EQ(buckets_1_2_5(1024), (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}));
}

actors::StatusReport two_workers() {
  actors::StatusReport st;
  core::WorkerStats a;
  a.id = 1;
  a.node = "local";
  a.device = "cpu";
  a.scheduler.num_running = 3;
  a.scheduler.num_waiting = 2;
  a.scheduler.blocks_used = 25;
  a.scheduler.blocks_free = 75;
  a.scheduler.prefix_query_tokens = 640;
  a.scheduler.prefix_hit_tokens = 128;
  a.scheduler.preemptions = 4;
  core::WorkerStats b = a;
  b.id = 2;
  b.node = "host\"b";
  b.scheduler.blocks_used = 0;
  b.scheduler.preemptions = 0;
  st.batcher.workers = {a, b};
  st.batcher.unplaced = 1;
  st.router.prompt_tokens = 300;
  st.router.output_tokens = 900;
  return st;
}

// One request: accepted, tokens at 100, 150 and 250 ms (+2 ids at once at 250), finished.
void one_request(MetricsCollector& m, const actors::ClientId& client, uint64_t tag) {
  m.observe({client, transport::Accepted{tag, 7}}, 0);
  transport::Tokens t;
  t.tag = tag;
  t.ids = {1};
  m.observe({client, t}, 100 * kMs);
  m.observe({client, t}, 150 * kMs);
  t.ids = {2, 3};
  m.observe({client, t}, 250 * kMs);
  transport::Finished f;
  f.tag = tag;
  f.finish_reason = core::FinishReason::kLength;
  f.usage = {5, 4, 0};
  f.timings = {20, 100, 260};
  m.observe({client, f}, 260 * kMs);
}

TEST(MetricsCollector, RequestTimingsBecomeVllmsHistograms) {
  MetricsCollector m({"gpt2", 1024});
  one_request(m, actors::ClientId::zmq("z1"), 1);
  m.observe({actors::ClientId::http(9), transport::Rejected{3, transport::RejectCode::kBusy, "full"}}, 0);
  EXPECT_EQ(m.tracked(), 0u);
  const std::string text = m.render(two_workers());
  const std::string L = "{model_name=\"gpt2\"}";
  EXPECT_EQ(sample(text, "troupe:time_to_first_token_seconds_count" + L), 1);
  EXPECT_DOUBLE_EQ(sample(text, "troupe:time_to_first_token_seconds_sum" + L), 0.1);
  EXPECT_EQ(sample(text, "troupe:time_to_first_token_seconds_bucket{model_name=\"gpt2\",le=\"0.08\"}"), 0);
  EXPECT_EQ(sample(text, "troupe:time_to_first_token_seconds_bucket{model_name=\"gpt2\",le=\"0.1\"}"), 1);
  // Gaps 50 ms, 100 ms, and 0 for the second of two ids that came together.
  EXPECT_EQ(sample(text, "troupe:inter_token_latency_seconds_count" + L), 3);
  EXPECT_DOUBLE_EQ(sample(text, "troupe:inter_token_latency_seconds_sum" + L), 0.15);
  // TPOT (260 - 100) / (4 - 1) ms.
  EXPECT_NEAR(sample(text, "troupe:request_time_per_output_token_seconds_sum" + L), 0.16 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(sample(text, "troupe:e2e_request_latency_seconds_sum" + L), 0.26);
  EXPECT_DOUBLE_EQ(sample(text, "troupe:request_queue_time_seconds_sum" + L), 0.02);
  EXPECT_DOUBLE_EQ(sample(text, "troupe:request_prefill_time_seconds_sum" + L), 0.08);
  EXPECT_DOUBLE_EQ(sample(text, "troupe:request_decode_time_seconds_sum" + L), 0.16);
  EXPECT_EQ(sample(text, "troupe:request_generation_tokens_sum" + L), 4);
  EXPECT_EQ(sample(text, "troupe:request_success_total{model_name=\"gpt2\",finished_reason=\"length\"}"), 1);
  EXPECT_EQ(sample(text, "troupe:request_success_total{model_name=\"gpt2\",finished_reason=\"eos\"}"), 0);
  EXPECT_EQ(sample(text, "troupe:request_rejected_total{model_name=\"gpt2\",reason=\"busy\"}"), 1);
}

TEST(MetricsCollector, StatusGivesPerWorkerGaugesAndCounters) {
  MetricsCollector m({"gpt2", 1024});
  const std::string text = m.render(two_workers());
  const std::string W1 = "{model_name=\"gpt2\",worker=\"1\"}", W2 = "{model_name=\"gpt2\",worker=\"2\"}";
  EXPECT_EQ(sample(text, "troupe:num_requests_running" + W1), 3);
  EXPECT_EQ(sample(text, "troupe:num_requests_waiting" + W2), 2);
  EXPECT_DOUBLE_EQ(sample(text, "troupe:kv_cache_usage_perc" + W1), 0.25);
  EXPECT_DOUBLE_EQ(sample(text, "troupe:kv_cache_usage_perc" + W2), 0.0);
  EXPECT_EQ(sample(text, "troupe:prefix_cache_queries_total" + W1), 640);
  EXPECT_EQ(sample(text, "troupe:prefix_cache_hits_total" + W1), 128);
  EXPECT_EQ(sample(text, "troupe:num_preemptions_total" + W1), 4);
  EXPECT_EQ(sample(text, "troupe:num_preemptions_total" + W2), 0);
  EXPECT_EQ(sample(text, "troupe:num_requests_unplaced{model_name=\"gpt2\"}"), 1);
  EXPECT_EQ(sample(text, "troupe:prompt_tokens_total{model_name=\"gpt2\"}"), 300);
  EXPECT_EQ(sample(text, "troupe:generation_tokens_total{model_name=\"gpt2\"}"), 900);
  EXPECT_EQ(sample(text, "troupe:num_workers{model_name=\"gpt2\"}"), 2);
  EXPECT_NE(text.find("node=\"host\\\"b\""), std::string::npos) << "label values are escaped";
}

// What the batcher counts of faults reaches /metrics.
TEST(MetricsCollector, FaultCountersFromTheBatcher) {
  MetricsCollector m({"gpt2", 1024});
  actors::StatusReport st = two_workers();
  st.batcher.counters = core::BatcherCounters{2, 1, 3, 40, 5000};
  const std::string text = m.render(st);
  auto reason = [](const char* r) { return std::string("{model_name=\"gpt2\",reason=\"") + r + "\"}"; };
  EXPECT_EQ(sample(text, "troupe:workers_left_total" + reason("lost")), 2);
  EXPECT_EQ(sample(text, "troupe:workers_left_total" + reason("hung")), 1);
  EXPECT_EQ(sample(text, "troupe:workers_left_total" + reason("broken")), 3);
  EXPECT_EQ(sample(text, "troupe:requests_moved_total{model_name=\"gpt2\"}"), 40);
  EXPECT_EQ(sample(text, "troupe:tokens_recomputed_total{model_name=\"gpt2\"}"), 5000);
}

TEST(MetricsCollector, AVanishedClientIsForgottenItsRequestsCancelled) {
  MetricsCollector m({"gpt2", 1024});
  m.observe({actors::ClientId::http(1), transport::Accepted{1, 1}}, 0);
  m.observe({actors::ClientId::http(1), transport::Accepted{2, 2}}, 0);
  m.observe({actors::ClientId::http(10), transport::Accepted{1, 3}}, 0);
  EXPECT_EQ(m.tracked(), 3u);
  m.forget(actors::ClientId::http(1));
  EXPECT_EQ(m.tracked(), 1u) << "h10 is another client";
  m.forget(actors::ClientId::http(1));  // nothing left to count
  const std::string text = m.render(actors::StatusReport{});
  EXPECT_EQ(sample(text, "troupe:request_success_total{model_name=\"gpt2\",finished_reason=\"cancelled\"}"),
            2);
}

// promtool (Prometheus' own parser and linter) on a full exposition; skipped
// where setup.sh has not put it in TROUPE_TOOLS_DIR.
TEST(MetricsCollector, PromtoolAcceptsTheExposition) {
  const std::string promtool = std::string(TROUPE_TOOLS_DIR) + "/bin/promtool";
  if (!std::filesystem::exists(promtool))
    GTEST_SKIP() << "no " << promtool << " (scripts/setup.sh installs it)";
  MetricsCollector m({"gpt2", 1024});
  one_request(m, actors::ClientId::zmq("z1"), 1);
  test::TempDir dir;
  {
    std::ofstream out(dir.file("metrics.txt"));
    out << m.render(two_workers());
  }
  const auto r =
      test::run_command(test::shell_quote(promtool) + " check metrics < " + dir.file("metrics.txt"));
  // Exit 3 = lint problems only; the one allowed is vLLM's own choice of ':' in names.
  EXPECT_TRUE(r.status == 0 || r.status == 3) << r.output;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_NE(line.find("metric names should not contain ':'"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace troupe::cluster
