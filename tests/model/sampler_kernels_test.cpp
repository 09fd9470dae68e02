// The sampler's kernel variants: each one against the portable variant bit
// for bit (tokens, logprobs, every kernel's output), and the pruned
// Gumbel-max against a full evaluation, with the work it saves counted.
#include "model/sampler_kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "isa_params.hpp"
#include "model/sampler.hpp"
#include "sampler_test_utils.hpp"

namespace troupe::model {
namespace {

using test::gaussian_logits;
using test::params;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Rows that exercise every path: near-uniform (a random model), peaked (a
// trained one), ties, -inf masks, small and real vocabularies.
std::vector<std::vector<float>> test_rows() {
  std::vector<std::vector<float>> rows;
  for (uint32_t r = 0; r < 4; ++r) rows.push_back(gaussian_logits(50257, r < 2 ? 0.05f : 3.0f, 300 + r));
  auto peaked = gaussian_logits(50257, 1.0f, 310);
  peaked[4242] = 30.0f;
  rows.push_back(peaked);
  auto ties = gaussian_logits(777, 1.0f, 311);
  for (size_t i = 0; i < ties.size(); i += 7) ties[i] = 1.5f;
  rows.push_back(ties);
  auto masked = gaussian_logits(1000, 2.0f, 312);
  for (size_t i = 0; i < masked.size(); i += 3) masked[i] = -INFINITY;
  rows.push_back(masked);
  rows.push_back({0.3f, -1.0f, 2.0f});
  return rows;
}

std::vector<SamplingParams> test_params(uint64_t seed) {
  return {params(0.0f, 0, 1.0f, seed, 5),    params(1.0f, 0, 1.0f, seed, -1),
          params(0.7f, 0, 0.9f, seed, 3),    params(1.3f, 40, 1.0f, seed, 0),
          params(1.0f, 50, 0.95f, seed, 20), params(0.2f, 0, 0.5f, seed, -1),
          params(2.0f, 300, 0.99f, seed, 1), params(1.0f, 0, 0.3f, seed, -1),
          params(5.0f, 0, 1.0f, seed, -1),   params(1e-30f, 0, 1.0f, seed, -1)};
}

class SamplerVariant : public ::testing::TestWithParam<CpuIsa> {};
// The vector variants, each compared with the portable one.
class SamplerVectorVariant : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(SamplerVectorVariant, TokensAndLogprobsAreThePortableBits) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  int compared = 0;
  for (const auto& row : test_rows()) {
    const int64_t vocab = static_cast<int64_t>(row.size());
    for (uint64_t seed = 0; seed < 6; ++seed) {
      for (const SamplingParams& p : test_params(seed * 7919 + 1)) {
        const int64_t position = 3 + static_cast<int64_t>(seed);
        SampledToken ref, got;
        {
          ScopedKernelIsa scope(CpuIsa::kPortable);
          ref = sample(row.data(), vocab, p, position);
        }
        {
          ScopedKernelIsa scope(isa);
          got = sample(row.data(), vocab, p, position);
        }
        SCOPED_TRACE("vocab " + std::to_string(vocab) + " T " + std::to_string(p.temperature) + " top_k " +
                     std::to_string(p.top_k) + " top_p " + std::to_string(p.top_p) + " seed " +
                     std::to_string(p.seed));
        ASSERT_EQ(got.id, ref.id);
        ASSERT_TRUE(same_bits(got.logprob, ref.logprob)) << got.logprob << " vs " << ref.logprob;
        ASSERT_EQ(got.top.size(), ref.top.size());
        for (size_t j = 0; j < ref.top.size(); ++j) {
          ASSERT_EQ(got.top[j].first, ref.top[j].first);
          ASSERT_TRUE(same_bits(got.top[j].second, ref.top[j].second));
        }
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 400);
}

TEST_P(SamplerVectorVariant, EveryKernelGivesThePortableBits) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const SamplerKernels& k = sampler_kernels(isa);
  const SamplerKernels& ref = sampler_kernels(CpuIsa::kPortable);
  for (const auto& row : test_rows()) {
    const int64_t n = static_cast<int64_t>(row.size());
    const LogitScan a = k.scan(row.data(), n), b = ref.scan(row.data(), n);
    EXPECT_EQ(a.argmax, b.argmax);
    EXPECT_TRUE(same_bits(a.max, b.max) && same_bits(a.min_finite, b.min_finite));
    std::vector<float> ea(n), eb(n);
    for (float scale : {1.0f, 0.37f, 11.0f}) {
      k.exp_shifted(row.data(), n, a.max, scale, ea.data());
      ref.exp_shifted(row.data(), n, a.max, scale, eb.data());
      EXPECT_EQ(std::memcmp(ea.data(), eb.data(), n * sizeof(float)), 0) << "scale " << scale;
      EXPECT_EQ(k.sum(ea.data(), n), ref.sum(eb.data(), n));
      for (const int64_t j : {int64_t{0}, n / 3, static_cast<int64_t>(a.argmax), n - 1}) {
        double ta, ba, tb, bb;
        k.sums_ranked_before(row.data(), ea.data(), n, j, &ta, &ba);
        ref.sums_ranked_before(row.data(), eb.data(), n, j, &tb, &bb);
        EXPECT_EQ(ta, tb);
        EXPECT_EQ(ba, bb);
        EXPECT_EQ(ta, ref.sum(eb.data(), n));  // the total is sum()'s, bit for bit
      }
    }
    std::vector<int32_t> ka(n), kb(n);
    k.bucket_keys(row.data(), n, a.max, 100.0f, 1024, ka.data());
    ref.bucket_keys(row.data(), n, a.max, 100.0f, 1024, kb.data());
    EXPECT_EQ(ka, kb);
  }
  for (int32_t id = 0; id < 100000; id += 7) {
    ASSERT_EQ(k.noise_bits(0x1234567890abcdefull, id), ref.noise_bits(0x1234567890abcdefull, id));
    ASSERT_TRUE(same_bits(k.noise(0x1234567890abcdefull, id), ref.noise(0x1234567890abcdefull, id)));
  }
}

// sums_ranked_before against its definition: ties rank by id, so an id
// holding the same logit as j counts only below j.
TEST_P(SamplerVariant, SumsRankedBeforeMatchTheirDefinition) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const SamplerKernels& k = sampler_kernels(isa);
  auto rows = test_rows();
  std::vector<float> ties(1000);
  for (size_t i = 0; i < ties.size(); ++i) ties[i] = static_cast<float>(i % 7);  // every value 140+ times
  rows.push_back(ties);
  for (const auto& row : rows) {
    const int64_t n = static_cast<int64_t>(row.size());
    std::vector<float> w(n);
    for (int64_t i = 0; i < n; ++i) w[i] = 1.0f + static_cast<float>(i % 13);  // exact in double sums
    for (const int64_t j : {int64_t{0}, int64_t{5}, n / 2, n / 2 + 1, n - 1}) {
      if (j >= n) continue;
      double want_total = 0, want_before = 0;
      for (int64_t i = 0; i < n; ++i) {
        want_total += w[i];
        if (row[i] > row[j] || (row[i] == row[j] && i < j)) want_before += w[i];
      }
      double total = -1, before = -1;
      k.sums_ranked_before(row.data(), w.data(), n, j, &total, &before);
      EXPECT_EQ(total, want_total) << "n " << n << " j " << j;
      EXPECT_EQ(before, want_before) << "n " << n << " j " << j;
    }
  }
}

// scan (its lane maxima too), collect and next_at_least against their plain definitions (the
// portable variant shares their code, so it is no reference for them).
TEST_P(SamplerVariant, ScanCollectAndNextAtLeastMatchTheirDefinitions) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const SamplerKernels& k = sampler_kernels(isa);
  auto rows = test_rows();
  auto late = gaussian_logits(50257, 1.0f, 320);
  late[50250] = 9.0f;  // the max in the last, partial chunk
  late[50256] = 9.0f;
  rows.push_back(late);
  rows.push_back(std::vector<float>(130, -INFINITY));
  for (const auto& row : rows) {
    const int64_t n = static_cast<int64_t>(row.size());
    const LogitScan s = k.scan(row.data(), n);
    const int64_t first_max = std::max_element(row.begin(), row.end()) - row.begin();
    EXPECT_EQ(s.argmax, first_max) << "the lowest id holding the max, n " << n;
    EXPECT_EQ(s.max, row[first_max]);
    for (const int64_t from : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, n / 2, n - 1, n}) {
      for (const float bound : {-INFINITY, 0.0f, 1.5f, s.max, 100.0f}) {
        int64_t want = n;
        for (int64_t i = std::max<int64_t>(0, from); i < n; ++i)
          if (row[i] >= bound) {
            want = i;
            break;
          }
        EXPECT_EQ(k.next_at_least(row.data(), std::min(from, n), n, bound), want)
            << "from " << from << " bound " << bound << " n " << n;
      }
    }
    for (int j = 0; j < kMaxLanes; ++j) {
      float want = -INFINITY;
      for (int64_t i = j; i < n; i += kMaxLanes) want = std::max(want, row[i]);
      EXPECT_EQ(s.lane_max[j], want) << "lane " << j << " n " << n;
    }
    std::vector<int32_t> key(n), out(n);
    k.bucket_keys(row.data(), n, s.max, 100.0f, 1024, key.data());
    for (const int32_t b : {0, 1, 7, 100, 1023}) {
      std::vector<int32_t> want;
      for (int64_t i = 0; i < n; ++i)
        if (key[i] == b) want.push_back(static_cast<int32_t>(i));
      const int64_t got = k.collect(key.data(), n, b, out.data());
      EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + got), want) << "bucket " << b << " n " << n;
      std::vector<int32_t> below;
      for (int64_t i = 0; i < n; ++i)
        if (key[i] < b) below.push_back(static_cast<int32_t>(i));
      const int64_t got_below = k.collect_below(key.data(), n, b, out.data());
      EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + got_below), below)
          << "below bucket " << b << " n " << n;
    }
  }
  const float bad[] = {1.0f, NAN, 2.0f};
  EXPECT_TRUE(k.scan(bad, 3).bad);
  const float inf[] = {1.0f, INFINITY};
  EXPECT_TRUE(k.scan(inf, 2).bad);
}

// The winner without pruning: every candidate scored with the kernel's noise.
GumbelWinner brute_force(const SamplerKernels& k, const float* x, const int32_t* ids, int64_t n, float shift,
                         float inv_t, uint64_t key, const int32_t* allow, int32_t below) {
  GumbelWinner w;
  float best = -INFINITY;
  int32_t best_id = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t id = ids ? ids[j] : static_cast<int32_t>(j);
    if (allow && allow[id] >= below) continue;
    const float s = (x[j] - shift) * inv_t + k.noise(key, id);
    if (w.index < 0 || s > best || (s == best && id < best_id)) {
      best = s;
      best_id = id;
      w.index = j;
    }
  }
  w.score = best;
  return w;
}

TEST_P(SamplerVariant, PrunedGumbelMaxIsTheFullOne) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const SamplerKernels& k = sampler_kernels(isa);
  int rows = 0;
  for (const auto& row : test_rows()) {
    const int64_t n = static_cast<int64_t>(row.size());
    const LogitScan s = k.scan(row.data(), n);
    std::vector<int32_t> allow(n), ids(n);
    for (int64_t i = 0; i < n; ++i) {
      allow[i] = static_cast<int32_t>((i * 2654435761u) % 5);  // ids with allow < 3 are candidates
      ids[i] = static_cast<int32_t>(n - 1 - i);                // reversed order: ties by id, not position
    }
    allow[s.argmax] = 0;
    std::vector<float> rev(row.rbegin(), row.rend());
    for (float t : {0.05f, 1.0f, 4.0f}) {
      for (uint64_t key : {1ull, 0xdeadbeefcafef00dull}) {
        SCOPED_TRACE("n " + std::to_string(n) + " T " + std::to_string(t) + " key " + std::to_string(key));
        const float inv_t = 1.0f / t;
        GumbelWinner got = k.gumbel_argmax(row.data(), nullptr, n, s.max, inv_t, key, nullptr, 0, s.argmax);
        GumbelWinner want = brute_force(k, row.data(), nullptr, n, s.max, inv_t, key, nullptr, 0);
        EXPECT_EQ(got.index, want.index);
        EXPECT_TRUE(same_bits(got.score, want.score));
        got = k.gumbel_argmax(row.data(), nullptr, n, s.max, inv_t, key, allow.data(), 3, s.argmax);
        want = brute_force(k, row.data(), nullptr, n, s.max, inv_t, key, allow.data(), 3);
        EXPECT_EQ(got.index, want.index);
        got = k.gumbel_argmax(rev.data(), ids.data(), n, s.max, inv_t, key, nullptr, 0, n - 1 - s.argmax);
        want = brute_force(k, rev.data(), ids.data(), n, s.max, inv_t, key, nullptr, 0);
        EXPECT_EQ(got.index, want.index);
        ++rows;
      }
    }
  }
  EXPECT_EQ(rows, 48);
}

// The bits bound (noise_k_bound) skips only ids that cannot win or tie: on
// flat rows, where it skips the most, many keys give the brute force's
// winner and score bits; also with exact ties (every logit equal) and tiny
// temperatures.
TEST_P(SamplerVariant, BitsBoundSkipsOnlyLosers) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const SamplerKernels& k = sampler_kernels(isa);
  const int64_t n = 50257;
  const auto flat = gaussian_logits(n, 0.05f, 79);
  const std::vector<float> equal(n, 1.5f);
  int64_t evaluated = 0, rows = 0;
  for (const auto* row : {&flat, &equal}) {
    const LogitScan s = k.scan(row->data(), n);
    for (float t : {1.0f, 0.3f, 0.01f}) {
      for (uint64_t key = 1; key <= 24; ++key) {
        const uint64_t kk = key * 0x9E3779B97F4A7C15ull;
        SCOPED_TRACE("T " + std::to_string(t) + " key " + std::to_string(kk));
        const GumbelWinner got =
            k.gumbel_argmax(row->data(), nullptr, n, s.max, 1.0f / t, kk, nullptr, 0, s.argmax);
        const GumbelWinner want = brute_force(k, row->data(), nullptr, n, s.max, 1.0f / t, kk, nullptr, 0);
        ASSERT_EQ(got.index, want.index);
        ASSERT_TRUE(same_bits(got.score, want.score));
        evaluated += got.evaluated;
        ++rows;
      }
    }
  }
  EXPECT_LT(evaluated, rows * n / 10);  // the bound did skip (else this test checks nothing new)
}

TEST_P(SamplerVariant, PeakedRowsComputeLittleNoise) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const SamplerKernels& k = sampler_kernels(isa);
  const int64_t n = 50257;
  auto row = gaussian_logits(n, 1.0f, 77);
  row[31337] = 40.0f;  // 40 above the rest at T = 1: beyond the noise's reach
  const LogitScan s = k.scan(row.data(), n);
  GumbelWinner w = k.gumbel_argmax(row.data(), nullptr, n, s.max, 1.0f, 5, nullptr, 0, s.argmax);
  EXPECT_EQ(w.index, 31337);
  EXPECT_LE(w.evaluated, 1 + 64);  // the start, and the one block of 64 holding it
  // Near-uniform logits: no logit is out of the noise's reach, but once the
  // best score is ~log(n), an id needs noise that only ~1 in 10^4 hashed bit
  // patterns give, so the bits bound skips nearly every block.
  const auto flat = gaussian_logits(n, 0.05f, 78);
  const LogitScan f = k.scan(flat.data(), n);
  w = k.gumbel_argmax(flat.data(), nullptr, n, f.max, 1.0f, 5, nullptr, 0, f.argmax);
  EXPECT_LT(w.evaluated, n / 20);
  // A trained model's row at T = 0.7: a handful of ids within reach.
  auto zipf = std::vector<float>(n);
  for (int64_t i = 0; i < n; ++i) zipf[i] = -1.1f * std::log(static_cast<float>((i * 7919) % n + 1)) * 3.0f;
  const LogitScan z = k.scan(zipf.data(), n);
  w = k.gumbel_argmax(zipf.data(), nullptr, n, z.max, 1.0f / 0.7f, 5, nullptr, 0, z.argmax);
  EXPECT_LT(w.evaluated, n / 4);
}

INSTANTIATE_TEST_SUITE_P(Isas, SamplerVariant, ::testing::ValuesIn(all_isas()), test::isa_name);
INSTANTIATE_TEST_SUITE_P(Isas, SamplerVectorVariant, ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512),
                         test::isa_name);

}  // namespace
}  // namespace troupe::model
