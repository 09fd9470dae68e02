// Synthetic workloads: seeded and reproducible, gaps with the asked mean and
// spread, lengths inside their distributions; prompts that share blocks
// exactly when their trace ids do.
#include "cluster/sim/workload.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "cluster/sim/prompt_builder.hpp"
#include "cluster/sim/random.hpp"
#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

SyntheticOptions options(int32_t n, double rate, double burstiness, uint64_t seed) {
  SyntheticOptions o;
  o.num_requests = n;
  o.request_rate = rate;
  o.burstiness = burstiness;
  o.seed = seed;
  o.input = parse_length_distribution("uniform:100:0.5");
  o.output = parse_length_distribution("lognormal:50:0.6");
  return o;
}

struct GapStats {
  double mean = 0, cv = 0;
};
GapStats gaps(const std::vector<WorkloadRequest>& w) {
  std::vector<double> g;
  for (size_t i = 1; i < w.size(); ++i) g.push_back((w[i].arrival_ns - w[i - 1].arrival_ns) / 1e9);
  double m = 0, v = 0;
  for (double x : g) m += x;
  m /= g.size();
  for (double x : g) v += (x - m) * (x - m);
  v /= g.size() - 1;
  return {m, std::sqrt(v) / m};
}

TEST(Workload, SameSeedSameListOtherSeedOtherList) {
  const auto a = generate_synthetic(options(500, 4, 1, 7));
  const auto b = generate_synthetic(options(500, 4, 1, 7));
  const auto c = generate_synthetic(options(500, 4, 1, 8));
  ASSERT_EQ(a.size(), 500u);
  size_t same = 0, differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same += a[i].arrival_ns == b[i].arrival_ns && a[i].input_len == b[i].input_len &&
            a[i].output_len == b[i].output_len;
    differ += a[i].arrival_ns != c[i].arrival_ns;
  }
  EXPECT_EQ(same, a.size());
  EXPECT_GT(differ, 490u);
  EXPECT_EQ(a[0].arrival_ns, 0);
}

TEST(Workload, StreamsAreIndependent) {
  // Changing the output distribution leaves arrivals and inputs as they were.
  auto o = options(200, 4, 1, 3);
  const auto a = generate_synthetic(o);
  o.output = parse_length_distribution("fixed:9");
  const auto b = generate_synthetic(o);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_ns, b[i].arrival_ns);
    EXPECT_EQ(a[i].input_len, b[i].input_len);
    EXPECT_EQ(b[i].output_len, 9);
  }
}

TEST(Workload, PoissonGapsHaveTheRateAndUnitSpread) {
  // n = 40000 exponential gaps: the mean's standard error is mean/200 (0.5%),
  // the CV's about 0.5%; 4 standard errors is 2%.
  const auto w = generate_synthetic(options(40001, 10, 1, 11));
  const GapStats s = gaps(w);
  EXPECT_NEAR(s.mean, 0.1, 0.1 * 0.02);
  EXPECT_NEAR(s.cv, 1.0, 0.03);
}

TEST(Workload, GammaBurstinessSetsTheSpread) {
  // Gamma gaps with shape b have CV 1/sqrt(b) at the same mean rate.
  for (double b : {0.25, 4.0}) {
    const auto w = generate_synthetic(options(40001, 5, b, 13));
    const GapStats s = gaps(w);
    EXPECT_NEAR(s.mean, 0.2, 0.2 * 0.04) << b;
    EXPECT_NEAR(s.cv, 1 / std::sqrt(b), 0.06 / std::sqrt(b)) << b;
  }
}

TEST(Workload, InfiniteRateSendsEverythingAtOnce) {
  const auto w = generate_synthetic(options(20, INFINITY, 1, 1));
  for (const auto& r : w) EXPECT_EQ(r.arrival_ns, 0);
}

TEST(Workload, LengthsStayInTheirDistributions) {
  auto o = options(20000, 100, 1, 5);
  const auto w = generate_synthetic(o);
  double sum_out = 0;
  std::set<int32_t> seen;
  for (const auto& r : w) {
    EXPECT_GE(r.input_len, 50);
    EXPECT_LE(r.input_len, 150);
    seen.insert(r.input_len);
    EXPECT_GE(r.output_len, 1);
    sum_out += r.output_len;
  }
  EXPECT_EQ(seen.size(), 101u);  // every length of [50, 150] drawn
  // Lognormal with sigma 0.6 has CV sqrt(e^0.36 - 1) = 0.66: the mean of 20000
  // is within 4 * 0.66 * 50 / sqrt(20000) = 0.93 of 50 (plus rounding to integers).
  EXPECT_NEAR(sum_out / w.size(), 50, 1.0);

  o.input = parse_length_distribution("file:" + test::fixture("lengths.txt"));
  for (const auto& r : generate_synthetic(o))
    EXPECT_TRUE(r.input_len == 12 || r.input_len == 40 || r.input_len == 7);
}

TEST(Workload, LengthSpecsParseAndPrint) {
  EXPECT_EQ(to_string(parse_length_distribution("128")), "fixed:128");
  EXPECT_EQ(to_string(parse_length_distribution("fixed:7")), "fixed:7");
  EXPECT_EQ(to_string(parse_length_distribution("uniform:128:0.25")), "uniform:128:0.25");
  EXPECT_EQ(to_string(parse_length_distribution("lognormal:64:0.8")), "lognormal:64:0.8");
  const auto f = parse_length_distribution("file:" + test::fixture("lengths.txt"));
  EXPECT_EQ(f.samples, (std::vector<int32_t>{12, 40, 40, 7}));
  for (const char* bad : {"", "0", "-3", "12.5", "fixed", "uniform:10", "uniform:10:1.5", "lognormal:10:0",
                          "gauss:10:1", "fixed:10:2"}) {
    EXPECT_THROW(parse_length_distribution(bad), std::invalid_argument) << bad;
  }
  EXPECT_THROW(parse_length_distribution("file:/nonexistent/lengths"), std::runtime_error);
  EXPECT_THROW(generate_synthetic(options(0, 1, 1, 0)), std::invalid_argument);
  EXPECT_THROW(generate_synthetic(options(5, 0, 1, 0)), std::invalid_argument);
  EXPECT_THROW(generate_synthetic(options(5, 1, 0, 0)), std::invalid_argument);
}

TEST(Workload, BadLengthFileNamesTheLine) {
  test::TempFile bad("3\nfour\n");
  try {
    parse_length_distribution("file:" + bad.path);
    FAIL() << "accepted a bad length";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.path + ":2:"), std::string::npos) << e.what();
  }
}

TEST(Workload, ScaleArrivals) {
  auto w = generate_synthetic(options(10, 2, 1, 3));
  const auto s = scale_arrivals(w, 0.5);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(s[i].arrival_ns, w[i].arrival_ns * 0.5, 1);
  EXPECT_THROW(scale_arrivals(w, 0), std::invalid_argument);
}

TEST(Random, DeterministicAndInRange) {
  Random a(42), b(42);
  for (int i = 0; i < 1000; ++i) {
    const int64_t x = a.uniform_int(-3, 3);
    EXPECT_EQ(x, b.uniform_int(-3, 3));
    EXPECT_GE(x, -3);
    EXPECT_LE(x, 3);
    const double u = a.uniform();
    EXPECT_EQ(u, b.uniform());
    EXPECT_GE(u, 0);
    EXPECT_LT(u, 1);
  }
  // Gamma(k, theta) has mean k*theta and variance k*theta^2; 40000 draws.
  Random g(9);
  double m = 0, v = 0;
  std::vector<double> xs;
  for (int i = 0; i < 40000; ++i) xs.push_back(g.gamma(0.5, 3.0));
  for (double x : xs) m += x;
  m /= xs.size();
  for (double x : xs) v += (x - m) * (x - m);
  v /= xs.size() - 1;
  EXPECT_NEAR(m, 1.5, 4 * std::sqrt(4.5 / 40000));
  EXPECT_NEAR(v, 4.5, 0.35);
}

TEST(PromptBuilder, BlocksAreEqualExactlyWhenHashIdsAre) {
  PromptOptions o;
  o.trace_block_tokens = 4;
  WorkloadRequest a, b, c;
  a.input_len = 10;
  a.hash_ids = {7, 8, 9};
  b.input_len = 11;
  b.hash_ids = {7, 8, 10};
  c.input_len = 10;
  const auto pa = build_prompt(a, 0, o), pb = build_prompt(b, 1, o), pc = build_prompt(c, 2, o),
             pc2 = build_prompt(c, 3, o);
  ASSERT_EQ(pa.size(), 10u);
  ASSERT_EQ(pb.size(), 11u);
  EXPECT_EQ(std::vector<int32_t>(pa.begin(), pa.begin() + 8),
            std::vector<int32_t>(pb.begin(), pb.begin() + 8));
  EXPECT_NE(std::vector<int32_t>(pa.begin() + 8, pa.end()),
            std::vector<int32_t>(pb.begin() + 8, pb.begin() + 10));
  EXPECT_NE(pc, pc2);  // no ids: every request its own tokens
  for (int32_t t : pa) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, o.vocab_size);
  }
  o.seed = 1;
  EXPECT_NE(build_prompt(a, 0, o), pa);
}

}  // namespace
}  // namespace troupe::cluster::sim
