#include "model/sampler.hpp"

#include "model/cpu_features.hpp"
#include "model/sampler_kernels.hpp"
#include "sampler_test_utils.hpp"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

namespace troupe::model {
namespace {

using test::gaussian_logits;
using test::params;

// The definition, written the slow way: rank all ids, softmax in double,
// cut top-k then top-p, then the Gumbel-max trick over the kept ids.
std::vector<int32_t> rank_order(const std::vector<float>& l) {
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  return ids;
}

// How many ids of `ids` (rank order) the params keep.
size_t reference_kept(const std::vector<float>& l, const std::vector<int32_t>& ids, const SamplingParams& p) {
  size_t n = p.top_k > 0 ? std::min<size_t>(p.top_k, l.size()) : l.size();
  if (p.top_p >= 1) return n;
  std::vector<double> w(n);
  double total = 0;
  for (size_t j = 0; j < n; ++j) total += w[j] = std::exp((double(l[ids[j]]) - l[ids[0]]) / p.temperature);
  double c = 0;
  for (size_t j = 0; j < n; ++j) {
    c += w[j];
    if (c >= p.top_p * total) return j + 1;
  }
  return n;
}

int32_t reference_sample(const std::vector<float>& l, const std::vector<int32_t>& ids,
                         const SamplingParams& p, int64_t position) {
  if (p.temperature == 0) return ids[0];
  const size_t n = reference_kept(l, ids, p);
  int32_t best = ids[0];
  double best_score = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    const double score = double(l[ids[j]]) / p.temperature + gumbel_noise(p.seed, position, ids[j]);
    if (score > best_score) {
      best_score = score;
      best = ids[j];
    }
  }
  return best;
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  auto l = gaussian_logits(1000, 2.0f, 1);
  const int32_t best = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  EXPECT_EQ(sample(l.data(), 1000, params(0), 3).id, best);
  l[10] = l[500] = 100.0f;
  EXPECT_EQ(sample(l.data(), 1000, params(0), 3).id, 10);
  std::vector<float> flat(50, 0.5f);
  EXPECT_EQ(sample(flat.data(), 50, params(0), 0).id, 0);
  // -inf is a legal mask.
  std::vector<float> masked(5, -INFINITY);
  masked[3] = -2.0f;
  EXPECT_EQ(sample(masked.data(), 5, params(0), 0).id, 3);
  EXPECT_EQ(sample(masked.data(), 5, params(1.0f), 0).id, 3);
}

TEST(Sampler, TopK1IsGreedy) {
  const auto l = gaussian_logits(50257, 3.0f, 2);
  const int32_t greedy = sample(l.data(), 50257, params(0), 0).id;
  for (int64_t pos = 0; pos < 50; ++pos)
    EXPECT_EQ(sample(l.data(), 50257, params(1.5f, 1, 1.0f, pos * 31 + 5), pos).id, greedy);
}

TEST(Sampler, SeedAndPositionEachChangeTheDraw) {
  const auto l = gaussian_logits(4000, 1.0f, 3);
  int differ_seed = 0, differ_pos = 0;
  for (int64_t pos = 0; pos < 100; ++pos) {
    const auto a = sample(l.data(), 4000, params(1.0f, 0, 1.0f, 11), pos).id;
    differ_seed += a != sample(l.data(), 4000, params(1.0f, 0, 1.0f, 12), pos).id;
    differ_pos += a != sample(l.data(), 4000, params(1.0f, 0, 1.0f, 11), pos + 1).id;
  }
  EXPECT_GT(differ_seed, 90);  // nearly flat over 4000 ids: collisions are rare
  EXPECT_GT(differ_pos, 90);
  EXPECT_NE(gumbel_noise(1, 5, 100), gumbel_noise(2, 5, 100));
  EXPECT_NE(gumbel_noise(1, 5, 100), gumbel_noise(1, 6, 100));
  EXPECT_NE(gumbel_noise(1, 5, 100), gumbel_noise(1, 5, 101));
}

// gumbel_noise(seed, pos, id) = -log(-log1p(-v)) for v from the top 31 bits
// of gumbel_noise_bits: check the float polynomials against libm in double,
// including the tiny v that decide winners over a large vocabulary, and the
// Gumbel moments.
TEST(Sampler, GumbelNoiseIsAccurateAndGumbelDistributed) {
  double max_err = 0, sum = 0, sum2 = 0;
  int64_t above_8 = 0, below_0 = 0;
  const int64_t n = 1000000;
  for (int64_t pos = 0; pos < n / 50000; ++pos) {
    for (int32_t id = 0; id < 50000; ++id) {
      const int32_t k = static_cast<int32_t>(gumbel_noise_bits(31, pos, id) >> 1);
      const double v = double(static_cast<float>(k - (k >> 24)) + 0.5f) * 0x1p-31;
      const double exact = -std::log(-std::log1p(-v));
      const float g = gumbel_noise(31, pos, id);
      max_err = std::max(max_err, std::abs(g - exact) / std::max(1.0, std::abs(exact)));
      sum += g;
      sum2 += double(g) * g;
      above_8 += g > 8;
      below_0 += g < 0;
    }
  }
  EXPECT_LT(max_err, 1e-6);
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5772157, 0.005);  // Euler-Mascheroni
  EXPECT_NEAR(var, 3.14159265358979 * 3.14159265358979 / 6, 0.01);
  // P(g > 8) = 1 - exp(-exp(-8)) = 3.354e-4; P(g < 0) = exp(-1).
  EXPECT_NEAR(above_8 / double(n), 3.354e-4, 0.6e-4);
  EXPECT_NEAR(below_0 / double(n), std::exp(-1.0), 0.002);
  // The largest noise the grid allows (v = 2^-32) is under the pruning bound.
  EXPECT_LT(-std::log(-std::log1p(-0x1p-32)), double(kGumbelNoiseMax));
}

// The hash behind the noise: consecutive ids of one row, and one id over
// consecutive positions and seeds, give bits of which every bit is a fair
// coin and whose top bytes are uniform (chi-square, 255 degrees of freedom:
// P(chi2 > 340) ~ 3e-4).
TEST(Sampler, NoiseBitsAreUniformAlongEveryKeyAxis) {
  auto check = [](const char* axis, const std::function<uint32_t(int32_t)>& bits) {
    SCOPED_TRACE(axis);
    const int n = 1 << 18;
    std::vector<int> ones(32, 0), bytes(256, 0);
    for (int i = 0; i < n; ++i) {
      const uint32_t b = bits(i);
      for (int k = 0; k < 32; ++k) ones[k] += (b >> k) & 1;
      bytes[b >> 24]++;
    }
    for (int k = 0; k < 32; ++k) EXPECT_NEAR(ones[k] / double(n), 0.5, 0.005) << "bit " << k;
    double chi2 = 0;
    for (int c : bytes) chi2 += (c - n / 256.0) * (c - n / 256.0) / (n / 256.0);
    EXPECT_LT(chi2, 340.0);
  };
  check("ids", [](int32_t i) { return gumbel_noise_bits(5, 9, i); });
  check("positions", [](int32_t i) { return gumbel_noise_bits(5, i, 123); });
  check("seeds", [](int32_t i) { return gumbel_noise_bits(static_cast<uint64_t>(i), 9, 123); });
}

TEST(Sampler, MatchesTheDefinitionOnManyRowsAndParams) {
  const std::vector<SamplingParams> settings = {
      params(1.0f),           params(0.7f, 0, 0.9f),    params(1.3f, 40),      params(1.0f, 50, 0.5f),
      params(0.2f, 0, 0.95f), params(2.0f, 300, 0.99f), params(1.0f, 0, 0.3f), params(5.0f)};
  int mismatches = 0, total = 0;
  for (uint32_t row = 0; row < 6; ++row) {
    const int64_t vocab = row % 2 ? 50257 : 777;
    const auto l = gaussian_logits(vocab, row < 3 ? 3.0f : 0.3f, 100 + row);
    const auto ids = rank_order(l);
    for (const auto& base : settings) {
      for (int64_t pos = 0; pos < 25; ++pos) {
        SamplingParams p = base;
        p.seed = row * 1000 + pos;
        mismatches += sample(l.data(), vocab, p, pos).id != reference_sample(l, ids, p, pos);
        ++total;
      }
    }
  }
  // Only float-vs-double rounding at a CDF boundary may disagree.
  EXPECT_LE(mismatches, 2) << "of " << total;
}

TEST(Sampler, TopKRestrictsSupport) {
  const auto l = gaussian_logits(500, 0.5f, 4);
  std::vector<int32_t> order(500);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  const std::set<int32_t> top10(order.begin(), order.begin() + 10);
  std::set<int32_t> seen;
  for (int64_t pos = 0; pos < 2000; ++pos) {
    const int32_t id = sample(l.data(), 500, params(1.0f, 10, 1.0f, 9), pos).id;
    ASSERT_TRUE(top10.count(id)) << "id " << id << " at position " << pos;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Sampler, TopPKeepsExactlyTheNucleus) {
  // Probabilities 0.5, 0.3, 0.15, then 0.05 spread over the other 997 ids.
  const int64_t vocab = 1000;
  std::vector<float> l(vocab, std::log(0.05f / 997));
  l[7] = std::log(0.5f);
  l[3] = std::log(0.3f);
  l[900] = std::log(0.15f);
  auto support = [&](float top_p) {
    std::map<int32_t, int> counts;
    for (int64_t pos = 0; pos < 4000; ++pos)
      counts[sample(l.data(), vocab, params(1.0f, 0, top_p, 5), pos).id]++;
    return counts;
  };
  auto c = support(0.4f);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.begin()->first, 7);
  c = support(0.75f);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_TRUE(c.count(7) && c.count(3));
  EXPECT_NEAR(c[7] / 4000.0, 0.625, 0.03);  // renormalised: 0.5 / 0.8
  c = support(0.9f);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_TRUE(c.count(7) && c.count(3) && c.count(900));
  c = support(1.0f);
  EXPECT_GT(c.size(), 100u);
}

// The nucleus may end inside a run of tied logits (one bucket of the walk):
// the tied ids after the cut, in id order, must never be drawn, whichever
// way the draw goes (the row's winner tried first from top_p 0.6, or the
// walk with the ids before the cut's bucket gathered, or masked).
TEST(Sampler, TopPNeverDrawsPastTheCutInsideATie) {
  std::vector<float> l(1000, 0.0f);
  for (int i = 0; i < 10; ++i) l[i] = 3.0f;  // weight e^3 each; the 990 tied ids weigh 1 each
  const auto ids = rank_order(l);
  for (float top_p : {0.3f, 0.7f}) {
    const size_t kept = reference_kept(l, ids, params(1.0f, 0, top_p, 1));
    ASSERT_GT(kept, 20u);
    ASSERT_LT(kept, 900u);
    int top = 0, tied = 0;
    for (int64_t pos = 0; pos < 3000; ++pos) {
      const int32_t id = sample(l.data(), 1000, params(1.0f, 0, top_p, 7), pos).id;
      ASSERT_LT(static_cast<size_t>(id), kept) << "top_p " << top_p << " position " << pos;
      (id < 10 ? top : tied)++;
    }
    EXPECT_GT(top, 0);
    EXPECT_GT(tied, 0);
  }
}

// Pearson chi-square of the frequencies of sampling with `p` at positions
// [0, draws) against softmax(l / expected_temperature) renormalised over the
// support that p's top-k and top-p keep; a draw outside it fails the test.
double chi_square(const std::vector<float>& l, SamplingParams p, int draws, float expected_temperature) {
  const auto ids = rank_order(l);
  const size_t kept = reference_kept(l, ids, p);
  std::vector<double> prob(l.size(), 0.0);
  double z = 0;
  for (size_t j = 0; j < kept; ++j) z += prob[ids[j]] = std::exp(l[ids[j]] / expected_temperature);
  std::vector<int> counts(l.size(), 0);
  p.seed = 1234;
  for (int pos = 0; pos < draws; ++pos) counts[sample(l.data(), static_cast<int64_t>(l.size()), p, pos).id]++;
  double chi2 = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (prob[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "id " << i << " is outside the kept support";
      continue;
    }
    const double expected = draws * prob[i] / z;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  const std::vector<float> l = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f, -1.0f, 1.5f, 0.9f};
  // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
  EXPECT_LT(chi_square(l, params(1.0f), 40000, 1.0f), 24.3);
  EXPECT_LT(chi_square(l, params(0.5f), 40000, 0.5f), 24.3);
  EXPECT_LT(chi_square(l, params(3.0f), 40000, 3.0f), 24.3);
  // The statistic does notice a distribution a little off.
  EXPECT_GT(chi_square(l, params(1.0f), 40000, 1.1f), 100.0);
  // Top-k 5 keeps ids 3, 6, 0, 7, 4 (4 degrees of freedom: P(chi2 > 18.5) =
  // 0.001); top-p 0.8 keeps 3, 6, 0, 7 (mass 0.363, 0.583, 0.716, 0.837; 3
  // degrees of freedom: P(chi2 > 16.3) = 0.001); both: top-p within the 5.
  EXPECT_LT(chi_square(l, params(1.0f, 5), 40000, 1.0f), 18.5);
  EXPECT_LT(chi_square(l, params(1.0f, 0, 0.8f), 40000, 1.0f), 16.3);
  EXPECT_LT(chi_square(l, params(1.0f, 5, 0.8f), 40000, 1.0f), 16.3);
  EXPECT_LT(chi_square(l, params(0.7f, 3), 40000, 0.7f), 13.9);  // 2 dof
}

TEST(Sampler, FrequenciesFollowTheSoftmaxOverAWiderVocab) {
  // 200 ids exercise the vectorised noise loop; 199 degrees of freedom:
  // P(chi2 > 273) = 0.0004.
  const auto l = gaussian_logits(200, 0.7f, 12);
  EXPECT_LT(chi_square(l, params(1.0f), 100000, 1.0f), 273.0);
  EXPECT_GT(chi_square(l, params(1.0f), 100000, 1.3f), 400.0);
  const auto ids = rank_order(l);
  const size_t kept = reference_kept(l, ids, params(1.0f, 0, 0.6f));
  ASSERT_GT(kept, 50u);
  ASSERT_LT(kept, 150u);
  // kept - 1 degrees of freedom; mean kept - 1, sd sqrt(2 (kept - 1)).
  const double dof = static_cast<double>(kept - 1);
  EXPECT_LT(chi_square(l, params(1.0f, 0, 0.6f), 100000, 1.0f), dof + 5 * std::sqrt(2 * dof));
}

// The same request through two numerically equivalent paths (contiguous KV
// vs paged, alone vs in a batch) gets logits that differ in the last bits;
// the token must not depend on that. Near-uniform logits over the real vocab
// (a random model) are the hard case: thousands of near-ties. (An inverse-CDF
// draw in rank order keeps the token only ~11% of the time here: a 1e-5
// nudge reorders ids whose logits are ~3e-6 apart.)
double fraction_unchanged_under_noise(const SamplingParams& base, int draws) {
  const int64_t vocab = 50257;
  std::mt19937 rng(77);
  std::bernoulli_distribution coin(0.5);
  int same = 0;
  for (int d = 0; d < draws; ++d) {
    auto l = gaussian_logits(vocab, 0.05f, 1000 + d);
    auto nudged = l;
    for (auto& x : nudged) x += coin(rng) ? 1e-5f : -1e-5f;
    SamplingParams p = base;
    p.seed = 9000 + d;
    const int64_t pos = 3 + d % 50;
    same += sample(l.data(), vocab, p, pos).id == sample(nudged.data(), vocab, p, pos).id;
  }
  return static_cast<double>(same) / draws;
}

TEST(Sampler, TinyLogitPerturbationsKeepTheToken) {
  EXPECT_GE(fraction_unchanged_under_noise(params(1.0f), 300), 0.99);
  EXPECT_GE(fraction_unchanged_under_noise(params(1.0f, 0, 0.9f), 300), 0.99);
  EXPECT_GE(fraction_unchanged_under_noise(params(0.7f, 50, 0.95f), 300), 0.99);
}

// The top logprobs and top-k on a full-width row where the best values are
// tied many times over, sit in a few lanes of the row's lane maxima, or share
// the row with -inf: rank order (value, then lower id), as a stable sort says.
TEST(Sampler, TopIdsOnWideRowsWithTiesAndMaskedIds) {
  const int64_t vocab = 50257;
  std::vector<std::vector<float>> rows;
  auto tied = gaussian_logits(vocab, 1.0f, 41);
  for (int64_t i = 0; i < vocab; i += 997) tied[i] = 7.0f;  // 51 ids tie at the max
  rows.push_back(tied);
  auto clustered = gaussian_logits(vocab, 1.0f, 42);
  for (int64_t i = 128; i < 128 + 64 * 40; i += 64) clustered[i] = 6.0f + 0.001f * (i % 7);  // one lane
  rows.push_back(clustered);
  auto masked = gaussian_logits(vocab, 2.0f, 43);
  for (int64_t i = 0; i < vocab; ++i)
    if (i % 64 < 60) masked[i] = -INFINITY;  // 60 of 64 lanes hold nothing but -inf
  rows.push_back(masked);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& l = rows[r];
    const auto ids = rank_order(l);
    for (int32_t n : {1, 5, 20, 64}) {
      if (n <= 20) {  // logprobs go up to 20
        const auto t = sample(l.data(), vocab, params(0.0f, 0, 1.0f, 0, n), 3);
        ASSERT_EQ(t.top.size(), static_cast<size_t>(n)) << "row " << r;
        for (int32_t j = 0; j < n; ++j)
          EXPECT_EQ(t.top[j].first, ids[j]) << "row " << r << " n " << n << " j " << j;
      }
      // Top-k keeps exactly the k best: every draw is one of them.
      for (int64_t pos = 0; pos < 20; ++pos) {
        const int32_t got = sample(l.data(), vocab, params(1.0f, n, 1.0f, pos), pos).id;
        EXPECT_TRUE(std::find(ids.begin(), ids.begin() + n, got) != ids.begin() + n)
            << "row " << r << " k " << n;
      }
    }
  }
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  const auto l = gaussian_logits(50257, 3.0f, 6);
  const auto lt = torch::from_blob(const_cast<float*>(l.data()), {50257}, torch::kFloat);
  const auto ref = torch::log_softmax(lt.to(torch::kDouble), 0);
  const auto topk = std::get<1>(ref.topk(20));
  for (float temperature : {0.0f, 0.8f, 1.0f, 2.0f}) {
    const auto t = sample(l.data(), 50257, params(temperature, 0, 0.9f, 3, 20), 17);
    EXPECT_NEAR(t.logprob, ref[t.id].item<double>(), 1e-4);
    ASSERT_EQ(t.top.size(), 20u);
    for (int j = 0; j < 20; ++j) {
      EXPECT_EQ(t.top[j].first, topk[j].item<int64_t>());
      EXPECT_NEAR(t.top[j].second, ref[t.top[j].first].item<double>(), 1e-4);
    }
  }
  // Top-p at temperature 1 reuses the weights and bucket sums it computed
  // for the nucleus: its total differs from the other paths' only in double
  // rounding, far below a float's (the same bits here), and nothing leaks
  // into the next row.
  const auto nucleus = sample(l.data(), 50257, params(1.0f, 0, 0.9f, 3, 20), 17);
  const auto greedy = sample(l.data(), 50257, params(0.0f, 0, 1.0f, 3, 20), 17);
  const auto hot = sample(l.data(), 50257, params(2.0f, 0, 0.9f, 3, 20), 17);
  EXPECT_EQ(nucleus.top, greedy.top);
  EXPECT_EQ(hot.top, greedy.top);
  auto row = l;  // one buffer, new logits written into it (as the next step's tensor may be)
  sample(row.data(), 50257, params(1.0f, 0, 0.9f, 3, 20), 17);
  for (float& x : row) x *= 2.0f;
  const auto next = sample(row.data(), 50257, params(0.0f, 0, 1.0f, 3, 1), 18);
  const auto lt2 = torch::from_blob(row.data(), {50257}, torch::kFloat);
  EXPECT_NEAR(next.logprob, torch::log_softmax(lt2.to(torch::kDouble), 0)[next.id].item<double>(), 1e-4);
  // Over a whole small vocabulary the probabilities sum to one.
  const std::vector<float> small = {0.1f, 2.0f, -3.0f, 0.5f, 0.5f};
  const auto t = sample(small.data(), 5, params(1.0f, 0, 1.0f, 1, 5), 0);
  ASSERT_EQ(t.top.size(), 5u);
  double sum = 0;
  for (const auto& [id, lp] : t.top) sum += std::exp(lp);
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_EQ(t.top[1].first, 3);  // tie with id 4: lower id first
  EXPECT_EQ(t.top[2].first, 4);
  const auto none = sample(small.data(), 5, params(1.0f, 0, 1.0f, 1, -1), 0);
  EXPECT_TRUE(none.top.empty());
  const auto zero = sample(small.data(), 5, params(1.0f, 0, 1.0f, 1, 0), 0);
  EXPECT_TRUE(zero.top.empty());
  EXPECT_LT(zero.logprob, 0.0f);
}

TEST(Sampler, InvalidParamsThrow) {
  const std::vector<float> l(10, 0.0f);
  auto bad = [&](SamplingParams p) {
    EXPECT_THROW(validate(p), std::invalid_argument);
    EXPECT_THROW(sample(l.data(), 10, p, 0), std::invalid_argument);
  };
  bad(params(-0.1f));
  bad(params(NAN));
  bad(params(INFINITY));
  bad(params(1.0f, -1));
  bad(params(1.0f, 0, 0.0f));
  bad(params(1.0f, 0, 1.5f));
  bad(params(1.0f, 0, NAN));
  bad(params(1.0f, 0, 1.0f, 0, -2));
  bad(params(1.0f, 0, 1.0f, 0, kMaxLogprobs + 1));
  EXPECT_NO_THROW(validate(params(0.0f, 5, 0.1f, 0, kMaxLogprobs)));
  EXPECT_THROW(sample(l.data(), 0, params(1.0f), 0), std::invalid_argument);
  std::vector<float> nan_row(l);
  nan_row[4] = NAN;
  EXPECT_THROW(sample(nan_row.data(), 10, params(0.0f), 0), std::runtime_error);
  std::vector<float> dead(10, -INFINITY);
  EXPECT_THROW(sample(dead.data(), 10, params(1.0f), 0), std::runtime_error);
}

// The logit adjustments are OpenAI's: each biased id gets its bias added,
// then each id generated c > 0 times loses frequency_penalty * c +
// presence_penalty; the draw is then the plain sampler's over that row, while
// logprobs stay those of the raw row. The values here are exact in float
// (multiples of 1/4, counts below 8), so the row written out below is the
// sampler's to the bit however this file is compiled.
TEST(Sampler, LogitAdjustmentsAreOpenAIsAndLogprobsStayRaw) {
  const int64_t vocab = 50257;
  const std::vector<int32_t> generated = {7, 50256, 7, 123, 7, 50256, 4000};
  int changed = 0;
  for (uint32_t row = 0; row < 4; ++row) {
    const auto raw = gaussian_logits(vocab, row < 2 ? 2.0f : 0.5f, 300 + row);
    const auto lt = torch::from_blob(const_cast<float*>(raw.data()), {vocab}, torch::kFloat);
    const auto ref = torch::log_softmax(lt.to(torch::kDouble), 0);
    for (const SamplingParams& base : {params(0.0f, 0, 1.0f, 1, 3), params(1.0f, 0, 1.0f, 2, 3),
                                       params(0.8f, 40, 0.9f, 3, 3), params(1.0f, 0, 0.5f, 4, 3)}) {
      SamplingParams p = base;
      p.presence_penalty = 0.5f;
      p.frequency_penalty = 1.25f;
      p.logit_bias = {{7, 2.0f}, {11, -100.0f}, {999, 3.75f}, {50256, 1.5f}};
      std::vector<float> expect = raw;
      for (const auto& [id, bias] : p.logit_bias) expect[id] = expect[id] + bias;
      const std::map<int32_t, int> counts = {{7, 3}, {50256, 2}, {123, 1}, {4000, 1}};
      for (const auto& [id, c] : counts)
        expect[id] = expect[id] - (p.frequency_penalty * static_cast<float>(c) + p.presence_penalty);
      for (int64_t pos = 20; pos < 30; ++pos) {
        p.seed = base.seed * 100 + pos;
        SamplingParams plain = base;
        plain.seed = p.seed;
        const auto before = raw;
        const SampledToken got = sample(raw.data(), vocab, p, pos, History(generated));
        EXPECT_EQ(raw, before) << "the caller's row is left as it was";
        const SampledToken on_adjusted = sample(expect.data(), vocab, plain, pos);
        const SampledToken on_raw = sample(raw.data(), vocab, plain, pos);
        EXPECT_EQ(got.id, on_adjusted.id) << "row " << row << " pos " << pos;
        EXPECT_NE(got.id, 11) << "a bias of -100 keeps the token out";
        EXPECT_EQ(got.top, on_raw.top);
        EXPECT_NEAR(got.logprob, ref[got.id].item<double>(), 1e-4);
        changed += got.id != on_raw.id;
      }
    }
  }
  EXPECT_GT(changed, 10) << "the adjustments were meant to move many draws";
  // Without generated tokens the penalties do nothing; a bias of +100 wins.
  const auto l = gaussian_logits(vocab, 2.0f, 9);
  SamplingParams p = params(0.0f);
  p.presence_penalty = 2.0f;
  p.frequency_penalty = 2.0f;
  EXPECT_EQ(sample(l.data(), vocab, p, 5).id, sample(l.data(), vocab, params(0.0f), 5).id);
  p.logit_bias = {{31337, 100.0f}};
  EXPECT_EQ(sample(l.data(), vocab, p, 5).id, 31337);
  for (float t : {0.5f, 1.0f, 2.0f}) {
    SamplingParams hot = p;
    hot.temperature = t;
    EXPECT_EQ(sample(l.data(), vocab, hot, 5).id, 31337) << "T " << t;
  }
  // Counting matters: the frequency penalty grows with each repeat, the
  // presence penalty does not.
  std::vector<float> two = {1.0f, 0.0f};
  SamplingParams freq = params(0.0f);
  freq.frequency_penalty = 0.5f;
  const std::vector<int32_t> zero_once = {0};
  EXPECT_EQ(sample(two.data(), 2, freq, 0, History(zero_once)).id, 0);
  const std::vector<int32_t> zero_thrice = {0, 0, 0};
  EXPECT_EQ(sample(two.data(), 2, freq, 0, History(zero_thrice)).id, 1);
  SamplingParams presence = params(0.0f);
  presence.presence_penalty = 0.75f;
  EXPECT_EQ(sample(two.data(), 2, presence, 0, History(zero_thrice)).id, 0);
  presence.presence_penalty = 1.25f;
  EXPECT_EQ(sample(two.data(), 2, presence, 0, History(zero_thrice)).id, 1);
  // The prompt's tokens count for none of them.
  EXPECT_EQ(sample(two.data(), 2, presence, 0, History(zero_thrice, 3)).id, 0);
  // Negative penalties favour what was generated.
  SamplingParams favour = params(0.0f);
  favour.presence_penalty = -1.5f;
  const std::vector<int32_t> one = {1};
  EXPECT_EQ(sample(two.data(), 2, favour, 0, History(one)).id, 1);
}

// The repetition penalty (CTRL's, as Hugging Face and vLLM apply it): every
// id of the prompt or generated so far, once however often it occurs, has a
// positive logit divided by it and a negative one multiplied; then the
// generated ids' frequency and presence penalties. Values exact in float.
TEST(Sampler, RepetitionPenaltyScalesEveryEarlierTokenOnce) {
  const int64_t vocab = 777;
  const auto raw = gaussian_logits(vocab, 2.0f, 41);
  const std::vector<int32_t> seq = {5, 9, 5, 300, 9, 9, 12};  // prompt 5 9 5, then generated 300 9 9 12
  int changed = 0;
  for (const SamplingParams& base : {params(0.0f), params(1.0f, 0, 1.0f, 3), params(0.7f, 20, 0.8f, 4)}) {
    SamplingParams p = base;
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.25f;
    p.logit_bias = {{9, 0.5f}};
    std::vector<float> expect = raw;
    expect[9] = expect[9] + 0.5f;
    for (int32_t id : {5, 9, 300, 12}) expect[id] = expect[id] > 0 ? expect[id] / 2.0f : expect[id] * 2.0f;
    for (int32_t id : {300, 9, 12}) expect[id] = expect[id] - 0.25f;  // no frequency penalty
    SamplingParams plain = base;
    for (int64_t pos = 7; pos < 40; ++pos) {
      p.seed = plain.seed = 50 + pos;
      const SampledToken got = sample(raw.data(), vocab, p, pos, History(seq, 3));
      EXPECT_EQ(got.id, sample(expect.data(), vocab, plain, pos).id) << pos;
      changed += got.id != sample(raw.data(), vocab, plain, pos).id;
    }
  }
  EXPECT_GT(changed, 0);
  // Greedy on two ids: 1.0 vs 0.6 with id 0 seen: 1.0 / 2 = 0.5 < 0.6.
  const std::vector<float> two = {1.0f, 0.6f};
  SamplingParams r = params(0.0f);
  r.repetition_penalty = 2.0f;
  const std::vector<int32_t> zero = {0};
  EXPECT_EQ(sample(two.data(), 2, r, 0, History(zero, 1)).id, 1) << "the prompt counts";
  r.repetition_penalty = 1.5f;  // 1.0 / 1.5 > 0.6
  EXPECT_EQ(sample(two.data(), 2, r, 0, History(zero, 1)).id, 0);
  // Negative logits are multiplied: -1 * 0.5 = -0.5 beats -0.6 when r < 1.
  const std::vector<float> negative = {-1.0f, -0.6f};
  r.repetition_penalty = 0.5f;
  EXPECT_EQ(sample(negative.data(), 2, r, 0, History(zero, 1)).id, 0);
  r.repetition_penalty = 2.0f;
  EXPECT_EQ(sample(negative.data(), 2, r, 0, History(zero, 1)).id, 1);
}

TEST(Sampler, InvalidAdjustmentsThrow) {
  const std::vector<float> l(10, 0.0f);
  auto with = [](auto edit) {
    SamplingParams p = params(1.0f);
    edit(p);
    return p;
  };
  auto bad = [&](const SamplingParams& p) {
    EXPECT_THROW(validate(p), std::invalid_argument);
    EXPECT_THROW(sample(l.data(), 10, p, 0), std::invalid_argument);
  };
  bad(with([](SamplingParams& p) { p.presence_penalty = 2.5f; }));
  bad(with([](SamplingParams& p) { p.frequency_penalty = -2.01f; }));
  bad(with([](SamplingParams& p) { p.frequency_penalty = NAN; }));
  bad(with([](SamplingParams& p) { p.repetition_penalty = 0.0f; }));
  bad(with([](SamplingParams& p) { p.repetition_penalty = 10.5f; }));
  bad(with([](SamplingParams& p) { p.repetition_penalty = INFINITY; }));
  bad(with([](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }));
  bad(with([](SamplingParams& p) { p.logit_bias = {{3, NAN}}; }));
  bad(with([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }));
  bad(with([](SamplingParams& p) { p.logit_bias = {{4, 1.0f}, {3, 1.0f}}; }));
  bad(with([](SamplingParams& p) { p.logit_bias = {{4, 1.0f}, {4, 2.0f}}; }));
  bad(with([](SamplingParams& p) { p.logit_bias.assign(core::kMaxLogitBias + 1, {0, 0.0f}); }));
  const SamplingParams edge = with([](SamplingParams& p) {
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.logit_bias = {{0, -100.0f}, {9, 100.0f}};
  });
  EXPECT_NO_THROW(validate(edge));
  EXPECT_NO_THROW(validate(edge, 10));
  // The vocabulary: a biased or generated id outside it.
  EXPECT_THROW(validate(edge, 9), std::invalid_argument);
  EXPECT_THROW(sample(l.data(), 9, edge, 0), std::invalid_argument);
  const std::vector<int32_t> outside = {3, 10};
  EXPECT_THROW(sample(l.data(), 10, edge, 0, History(outside)), std::invalid_argument);
  EXPECT_EQ(core::sorted_logit_bias({{9, 1.0f}, {2, -1.0f}}),
            (std::vector<std::pair<int32_t, float>>{{2, -1.0f}, {9, 1.0f}}));
  EXPECT_THROW(core::sorted_logit_bias({{9, 1.0f}, {9, -1.0f}}), std::invalid_argument);
  // logit_bias keys as text: decimal digits, at most 9.
  EXPECT_EQ(core::token_id_from_text("50256"), std::optional<int32_t>(50256));
  EXPECT_EQ(core::token_id_from_text("007"), std::optional<int32_t>(7));
  EXPECT_EQ(core::token_id_from_text("999999999"), std::optional<int32_t>(999999999));
  for (const char* bad_id : {"", "-1", "+1", " 1", "1e3", "1.0", "0x10", "1234567890"})
    EXPECT_EQ(core::token_id_from_text(bad_id), std::nullopt) << bad_id;
}

TEST(Sampler, SampleRowsEqualsPerRowWhateverTheBatch) {
  const int64_t vocab = 50257;
  std::vector<std::vector<float>> rows;
  for (uint32_t r = 0; r < 8; ++r) rows.push_back(gaussian_logits(vocab, 2.0f, 200 + r));
  auto batch = torch::empty({8, vocab}, torch::kFloat);
  for (int r = 0; r < 8; ++r) std::copy(rows[r].begin(), rows[r].end(), batch[r].data_ptr<float>());
  std::vector<SamplingParams> ps;
  std::vector<int64_t> positions;
  for (int r = 0; r < 8; ++r) {
    ps.push_back(
        params(r % 3 == 0 ? 0.0f : 1.0f, r % 2 ? 40 : 0, r % 4 ? 0.9f : 1.0f, 50 + r, r % 2 ? 3 : -1));
    positions.push_back(10 + r);
  }
  const auto out = sample_rows(batch, ps, positions);
  ASSERT_EQ(out.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    const auto alone = sample(rows[r].data(), vocab, ps[r], positions[r]);
    EXPECT_EQ(out[r].id, alone.id) << "row " << r;
    EXPECT_EQ(out[r].top, alone.top);
  }
  // Reversed batch order and double precision input: same tokens.
  const auto rev = sample_rows(batch.flip({0}).to(torch::kDouble), {ps.rbegin(), ps.rend()},
                               {positions.rbegin(), positions.rend()});
  for (int r = 0; r < 8; ++r) EXPECT_EQ(rev[7 - r].id, out[r].id);
  EXPECT_THROW(sample_rows(batch, {ps.begin(), ps.begin() + 7}, positions), std::invalid_argument);
  EXPECT_THROW(sample_rows(batch[0], {ps[0]}, {0}), std::invalid_argument);
  // Each row's generated tokens go with it.
  std::vector<std::vector<int32_t>> histories;
  std::vector<History> generated;
  auto penalized = ps;
  for (int r = 0; r < 8; ++r) {
    penalized[r].presence_penalty = 2.0f;
    histories.push_back({out[r].id, out[(r + 1) % 8].id});
  }
  for (const auto& h : histories) generated.emplace_back(h);
  const auto pen = sample_rows(batch, penalized, positions, generated);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(pen[r].id, sample(rows[r].data(), vocab, penalized[r], positions[r], generated[r]).id);
    if (penalized[r].temperature == 0.0f) {
      EXPECT_NE(pen[r].id, out[r].id) << "greedy row " << r;
    }
  }
  EXPECT_THROW(sample_rows(batch, penalized, positions, {generated.begin(), generated.begin() + 7}),
               std::invalid_argument);
  auto bad = ps;
  bad[5].top_p = 2.0f;
  EXPECT_THROW(sample_rows(batch, bad, positions), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::model
