// vLLM's serving metrics on hand-computed cases: numpy's percentiles, TPOT,
// pooled ITL, goodput under SLOs, peaks, and the result JSON's keys.
#include "core/serving_metrics.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace troupe::core {
namespace {

constexpr int64_t kMs = 1'000'000;

RequestTiming timing(uint64_t id, int64_t start_ms, std::vector<int64_t> tokens_ms, int64_t end_ms,
                     int32_t prompt) {
  RequestTiming r;
  r.id = id;
  r.start_ns = start_ms * kMs;
  for (int64_t t : tokens_ms) r.token_ns.push_back(t * kMs);
  r.end_ns = end_ms * kMs;
  r.prompt_tokens = prompt;
  r.output_tokens = static_cast<int32_t>(tokens_ms.size());
  return r;
}

// A: TTFT 100, gaps 50 100, E2EL 250, TPOT 75.  B: one token, TTFT = E2EL = 300.
// C: TTFT 50, gaps 20 20 20, E2EL 120, TPOT 70/3.  D: failed.
std::vector<RequestTiming> three_and_a_failure() {
  std::vector<RequestTiming> v;
  v.push_back(timing(1, 0, {100, 150, 250}, 250, 10));
  v.push_back(timing(2, 1000, {1300}, 1300, 20));
  v.push_back(timing(3, 2000, {2050, 2070, 2090, 2110}, 2120, 5));
  RequestTiming d = timing(4, 2500, {}, 2600, 7);
  d.success = false;
  d.error = "no worker";
  v.push_back(d);
  return v;
}

TEST(ServingMetrics, PercentileIsNumpysLinearInterpolation) {
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 25), 1.75);  // numpy.percentile([1,2,3,4], 25)
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  std::vector<double> one = {7};
  EXPECT_DOUBLE_EQ(percentile(one, 99), 7.0);
  std::vector<double> none;
  EXPECT_DOUBLE_EQ(percentile(none, 50), 0.0);
  EXPECT_THROW(percentile(v, 101), std::invalid_argument);
  EXPECT_THROW(percentile(v, -1), std::invalid_argument);
}

TEST(ServingMetrics, HandComputedRun) {
  const auto reqs = three_and_a_failure();
  const ServingMetrics m = compute_serving_metrics(reqs, 3.0);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input_tokens, 35);  // the failed request's prompt does not count
  EXPECT_EQ(m.total_output_tokens, 8);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 8.0 / 3);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 43.0 / 3);
  EXPECT_FALSE(m.request_goodput);

  EXPECT_EQ(m.ttft.count, 3u);
  EXPECT_NEAR(m.ttft.mean_ms, 150, 1e-9);
  EXPECT_NEAR(m.ttft.median_ms, 100, 1e-9);
  EXPECT_NEAR(m.ttft.std_ms, std::sqrt(35000.0 / 3), 1e-9);  // population std
  EXPECT_NEAR(m.ttft.at(90), 260, 1e-9);
  EXPECT_NEAR(m.ttft.at(99), 296, 1e-9);

  EXPECT_EQ(m.tpot.count, 2u);  // B has one token: no TPOT
  EXPECT_NEAR(m.tpot.mean_ms, (75 + 70.0 / 3) / 2, 1e-9);
  EXPECT_NEAR(m.tpot.at(90), 70.0 / 3 + 0.9 * (75 - 70.0 / 3), 1e-9);

  EXPECT_EQ(m.itl.count, 5u);  // pooled over requests: 50 100 20 20 20
  EXPECT_NEAR(m.itl.mean_ms, 42, 1e-9);
  EXPECT_NEAR(m.itl.median_ms, 20, 1e-9);
  EXPECT_NEAR(m.itl.std_ms, std::sqrt(976.0), 1e-9);
  EXPECT_NEAR(m.itl.at(90), 80, 1e-9);
  EXPECT_NEAR(m.itl.at(99), 98, 1e-9);

  EXPECT_NEAR(m.e2el.mean_ms, 670.0 / 3, 1e-9);
  EXPECT_NEAR(m.e2el.median_ms, 250, 1e-9);
  EXPECT_NEAR(m.e2el.at(90), 290, 1e-9);

  EXPECT_EQ(m.max_output_tokens_per_s, 4);  // C's four tokens in second 2
  EXPECT_EQ(m.max_concurrent_requests, 1);
  EXPECT_THROW(m.ttft.at(50), std::out_of_range);
}

TEST(ServingMetrics, GoodputCountsRequestsMeetingEveryTarget) {
  const auto reqs = three_and_a_failure();
  MetricsOptions o;
  o.slo = parse_slo({"ttft:200", "tpot:80"});
  ServingMetrics m = compute_serving_metrics(reqs, 3.0, o);
  ASSERT_TRUE(m.request_goodput);
  EXPECT_EQ(m.good_requests, 2);  // A and C; B's TTFT is 300
  EXPECT_DOUBLE_EQ(*m.request_goodput, 2.0 / 3);

  o.slo = parse_slo({"e2el:200"});
  m = compute_serving_metrics(reqs, 3.0, o);
  EXPECT_EQ(m.good_requests, 1);  // only C

  o.slo = parse_slo({"tpot:0"});  // B's single token counts as TPOT 0
  m = compute_serving_metrics(reqs, 3.0, o);
  EXPECT_EQ(m.good_requests, 1);

  o.slo = parse_slo({"ttft:100"});  // the target itself is met (<=)
  m = compute_serving_metrics(reqs, 3.0, o);
  EXPECT_EQ(m.good_requests, 2);
}

TEST(ServingMetrics, ConcurrencyIsHalfOpen) {
  std::vector<RequestTiming> v;
  v.push_back(timing(1, 0, {10}, 100, 1));
  v.push_back(timing(2, 100, {110}, 200, 1));  // starts as 1 ends: never together
  v.push_back(timing(3, 50, {60}, 150, 1));    // overlaps both
  const ServingMetrics m = compute_serving_metrics(v, 1.0);
  EXPECT_EQ(m.max_concurrent_requests, 2);
}

TEST(ServingMetrics, RejectsBadInput) {
  auto reqs = three_and_a_failure();
  EXPECT_THROW(compute_serving_metrics(reqs, 0.0), std::invalid_argument);
  reqs[0].end_ns = reqs[0].token_ns.back() - 1;
  try {
    compute_serving_metrics(reqs, 3.0);
    FAIL() << "accepted an end before the last token";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("request 1"), std::string::npos) << e.what();
  }
  MetricsOptions o;
  o.percentiles = {150};
  EXPECT_THROW(compute_serving_metrics(three_and_a_failure(), 3.0, o), std::invalid_argument);
}

TEST(ServingMetrics, ParseSlo) {
  const SloTargets s = parse_slo({"ttft:500", "tpot:12.5", "e2el:0"});
  EXPECT_EQ(*s.ttft_ms, 500);
  EXPECT_EQ(*s.tpot_ms, 12.5);
  EXPECT_EQ(*s.e2el_ms, 0);
  EXPECT_EQ(to_string(s), "ttft:500 tpot:12.5 e2el:0");
  EXPECT_TRUE(parse_slo({}).empty());
  for (const char* bad : {"ttft", "ttft:", "ttft:-1", "ttft:abc", "ttft:5ms", "queue:5", ":5"}) {
    try {
      parse_slo({bad});
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(ServingMetrics, ResultJsonUsesVllmKeys) {
  const auto reqs = three_and_a_failure();
  MetricsOptions o;
  o.percentiles = {90, 99, 99.9};
  o.slo = parse_slo({"ttft:200"});
  const auto j = to_result_json(compute_serving_metrics(reqs, 3.0, o), reqs);
  for (const char* k : {"duration",
                        "completed",
                        "failed",
                        "total_input_tokens",
                        "total_output_tokens",
                        "request_throughput",
                        "request_goodput",
                        "output_throughput",
                        "total_token_throughput",
                        "mean_ttft_ms",
                        "median_ttft_ms",
                        "std_ttft_ms",
                        "p90_ttft_ms",
                        "p99_ttft_ms",
                        "p99.9_ttft_ms",
                        "mean_tpot_ms",
                        "p99_tpot_ms",
                        "mean_itl_ms",
                        "p90_itl_ms",
                        "mean_e2el_ms",
                        "p99_e2el_ms",
                        "input_lens",
                        "output_lens",
                        "ttfts",
                        "itls",
                        "latencies",
                        "start_times",
                        "errors"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["completed"], 3);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 2.0 / 3);
  EXPECT_DOUBLE_EQ(j["p90_ttft_ms"].get<double>(), 260);
  EXPECT_EQ(j["output_lens"], nlohmann::ordered_json({3, 1, 4, 0}));
  EXPECT_DOUBLE_EQ(j["ttfts"][2].get<double>(), 0.05);
  EXPECT_EQ(j["itls"][0].size(), 2u);
  EXPECT_DOUBLE_EQ(j["itls"][0][1].get<double>(), 0.1);
  EXPECT_EQ(j["errors"][3], "no worker");
  EXPECT_TRUE(j["first_token_times"][3].is_null());

  const auto plain = to_result_json(compute_serving_metrics(reqs, 3.0), reqs, {/*itls=*/false});
  EXPECT_TRUE(plain["request_goodput"].is_null());
  EXPECT_FALSE(plain.contains("itls"));
}

TEST(ServingMetrics, SummaryReadsLikeVllms) {
  const auto reqs = three_and_a_failure();
  const std::string s = format_summary(compute_serving_metrics(reqs, 3.0));
  EXPECT_NE(s.find("============ Serving Benchmark Result ============"), std::string::npos) << s;
  EXPECT_NE(s.find("Mean TTFT (ms):                          150.00"), std::string::npos) << s;
  EXPECT_NE(s.find("P99 ITL (ms):                            98.00"), std::string::npos) << s;
  EXPECT_EQ(s.find("goodput"), std::string::npos);
}

}  // namespace
}  // namespace troupe::core
