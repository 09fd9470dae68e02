// The two paged-attention paths (in-place CPU kernel, in every variant the
// CPU runs, and portable gather) against a plain-loop reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "isa_params.hpp"
#include "model/paged_attention.hpp"

namespace troupe::model {
namespace {

// A random flat batch over random pools: sequences with the given context
// lengths and query rows, blocks drawn from a shuffled pool.
struct Problem {
  PagedAttentionInput in;
  int64_t block_size = 16;
};

Problem make_problem(int64_t H, int64_t D, int64_t bs, const std::vector<int64_t>& ctx,
                     const std::vector<int64_t>& rows, uint32_t seed, float unused_fill = 0.f) {
  std::mt19937 rng(seed);
  at::manual_seed(seed);
  int64_t blocks = 0, max_blocks = 1;
  for (int64_t c : ctx) {
    blocks += (c + bs - 1) / bs;
    max_blocks = std::max(max_blocks, (c + bs - 1) / bs);
  }
  const int64_t nb = blocks + 5;
  std::vector<int32_t> ids(static_cast<size_t>(nb));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  Problem p;
  p.block_size = bs;
  p.in.k_pool = torch::full({nb, H, bs, D}, unused_fill);
  p.in.v_pool = torch::full({nb, H, bs, D}, unused_fill);
  p.in.block_tables = torch::zeros({static_cast<int64_t>(ctx.size()), max_blocks}, torch::kInt);
  p.in.query_start = {0};
  size_t next = 0;
  for (size_t s = 0; s < ctx.size(); ++s) {
    for (int64_t j = 0; j < ctx[s]; ++j) {
      if (j % bs == 0) p.in.block_tables[static_cast<int64_t>(s)][j / bs] = ids[next++];
      const int64_t blk = p.in.block_tables[static_cast<int64_t>(s)][j / bs].item<int32_t>();
      p.in.k_pool.select(0, blk).select(1, j % bs).copy_(2.0 * torch::randn({H, D}));
      p.in.v_pool.select(0, blk).select(1, j % bs).copy_(torch::randn({H, D}));
    }
    p.in.query_start.push_back(p.in.query_start.back() + rows[s]);
    p.in.context_lens.push_back(ctx[s]);
  }
  p.in.q = torch::randn({p.in.query_start.back(), H, D});
  return p;
}

// Plain loops in double: the definition of the contract in paged_attention.hpp.
torch::Tensor reference(const Problem& p) {
  const auto& in = p.in;
  const int64_t T = in.q.size(0), H = in.q.size(1), D = in.q.size(2), bs = p.block_size;
  auto q = in.q.accessor<float, 3>();
  auto k = in.k_pool.accessor<float, 4>();
  auto v = in.v_pool.accessor<float, 4>();
  auto bt = in.block_tables.accessor<int32_t, 2>();
  torch::Tensor out = torch::zeros({T, H, D});
  auto o = out.accessor<float, 3>();
  for (size_t s = 0; s + 1 < in.query_start.size(); ++s) {
    const int64_t q1 = in.query_start[s + 1];
    for (int64_t i = in.query_start[s]; i < q1; ++i) {
      const int64_t pos = in.context_lens[s] - (q1 - i);
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> w(static_cast<size_t>(pos + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          const int32_t blk = bt[static_cast<int64_t>(s)][j / bs];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[i][h][d]) * k[blk][h][j % bs][d];
          w[static_cast<size_t>(j)] = dot / std::sqrt(double(D));
          mx = std::max(mx, w[static_cast<size_t>(j)]);
        }
        for (auto& x : w) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= pos; ++j) {
            const int32_t blk = bt[static_cast<int64_t>(s)][j / bs];
            acc += w[static_cast<size_t>(j)] * v[blk][h][j % bs][d];
          }
          o[i][h][d] = static_cast<float>(acc / sum);
        }
      }
    }
  }
  return out;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

class AttentionVariant : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(AttentionVariant, KernelAndGatherMatchPlainLoops) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(GetParam());
  ScopedKernelIsa scope(GetParam());
  std::mt19937 rng(5);
  int cases = 0;
  for (int64_t bs : {16, 8}) {
    for (int64_t H : {2, 5, 12}) {
      for (int64_t D : {64, 32, 40}) {
        // Decodes, long and short prefill chunks, a whole-context prefill,
        // context 1 and up to 600 tokens.
        std::vector<int64_t> ctx{1, 600, 17, 300, 33, static_cast<int64_t>(1 + rng() % 599)};
        std::vector<int64_t> rows{1, 1, 17, 21, 1, 3};
        const Problem p = make_problem(H, D, bs, ctx, rows, static_cast<uint32_t>(rng()));
        SCOPED_TRACE("bs " + std::to_string(bs) + " H " + std::to_string(H) + " D " + std::to_string(D));
        const torch::Tensor want = reference(p);
        const torch::Tensor kernel = paged_attention_cpu(p.in);
        const torch::Tensor gather = paged_attention_gather(p.in);
        ASSERT_EQ(kernel.sizes(), want.sizes());
        ASSERT_EQ(gather.sizes(), want.sizes());
        EXPECT_LT(max_diff(kernel, want), 1e-5);
        EXPECT_LT(max_diff(gather, want), 1e-5);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 18);
}

TEST_P(AttentionVariant, RandomContextsAgreeBetweenKernelAndGather) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(GetParam());
  ScopedKernelIsa scope(GetParam());
  std::mt19937 rng(11);
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t bs = trial % 2 ? 8 : 16;
    const int64_t H = 2 + static_cast<int64_t>(rng() % 11);
    std::vector<int64_t> ctx, rows;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int s = 0; s < n; ++s) {
      ctx.push_back(1 + static_cast<int64_t>(rng() % 600));
      rows.push_back(rng() % 2 ? 1 : 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(ctx.back())));
    }
    const Problem p = make_problem(H, 64, bs, ctx, rows, static_cast<uint32_t>(rng()));
    EXPECT_LT(max_diff(paged_attention_cpu(p.in), paged_attention_gather(p.in)), 1e-5) << "trial " << trial;
  }
}

// Every slot outside the sequences' contexts holds NaN (a pool is not
// zero-filled, and a recycled block may hold anything): one stray read, or a
// zero weight times a NaN value, shows.
TEST_P(AttentionVariant, BothPathsReadOnlyTheSlotsOfTheContext) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(GetParam());
  ScopedKernelIsa scope(GetParam());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Decodes of unequal contexts (padded in one batched gather) and a prefill chunk.
  const Problem p = make_problem(4, 64, 16, {40, 7, 16, 3}, {1, 7, 3, 1}, 3, nan);
  const torch::Tensor want = reference(p);
  for (const torch::Tensor& got : {paged_attention_cpu(p.in), paged_attention_gather(p.in)}) {
    EXPECT_TRUE(torch::isfinite(got).all().item<bool>());
    EXPECT_LT(max_diff(got, want), 1e-5);
  }
}

// A NaN in the context (a diverged model) must reach the output, not vanish
// in the softmax, so the sampler can refuse it.
TEST_P(AttentionVariant, KernelPropagatesANanInTheContext) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(GetParam());
  ScopedKernelIsa scope(GetParam());
  Problem p = make_problem(2, 32, 8, {20}, {1}, 4);
  const int32_t blk = p.in.block_tables[0][1].item<int32_t>();
  p.in.k_pool.select(0, blk).select(1, 3).fill_(std::numeric_limits<float>::quiet_NaN());
  const torch::Tensor got = paged_attention_cpu(p.in);
  EXPECT_TRUE(torch::isnan(got).all().item<bool>());
}

// Work items are spread over threads; an item lost or done twice at some
// thread count shows as a wrong row.
TEST_P(AttentionVariant, KernelIsRightOnOneOrManyThreads) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(GetParam());
  ScopedKernelIsa scope(GetParam());
  const Problem p = make_problem(12, 64, 16, {500, 3, 129, 64}, {1, 3, 40, 1}, 9);
  const torch::Tensor want = reference(p);
  const int saved = at::get_num_threads();
  for (int threads : {1, 2, 5}) {
    at::set_num_threads(threads);
    EXPECT_LT(max_diff(paged_attention_cpu(p.in), want), 1e-5) << threads << " threads";
  }
  at::set_num_threads(saved);
}

// bfloat16 pools: K/V widened in registers, so the result is bit-equal to
// the same path on fp32 pools holding the rounded values, on every code path
// of the kernel (decodes of whole heads and of one head, few and many prefill
// rows) where the head dimension is whole vectors, within an ulp or two where
// it is not (D 40), and bit-equal in the gather path.
TEST_P(AttentionVariant, BfloatPoolsEqualFp32PoolsOfTheRoundedValues) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(GetParam());
  ScopedKernelIsa scope(GetParam());
  std::mt19937 rng(21);
  for (int64_t bs : {16, 8}) {
    for (int64_t D : {64, 32, 40}) {
      // Enough decodes that whole-head items run (S >= 2 x threads) as well as per-head ones.
      std::vector<int64_t> ctx{1, 300, 17, 90, 33, 5, 64, 200, 9, 41};
      std::vector<int64_t> rows{1, 1, 17, 21, 1, 3, 1, 1, 1, 8};
      Problem p = make_problem(5, D, bs, ctx, rows, static_cast<uint32_t>(rng()));
      SCOPED_TRACE("bs " + std::to_string(bs) + " D " + std::to_string(D));
      PagedAttentionInput b16 = p.in;
      b16.k_pool = p.in.k_pool.to(torch::kBFloat16);
      b16.v_pool = p.in.v_pool.to(torch::kBFloat16);
      EXPECT_GT(max_diff(b16.k_pool.to(torch::kFloat32), p.in.k_pool), 0.0) << "rounding changed nothing";
      p.in.k_pool = b16.k_pool.to(torch::kFloat32);
      p.in.v_pool = b16.v_pool.to(torch::kFloat32);
      const torch::Tensor want = reference(p);
      const torch::Tensor k32 = paged_attention_cpu(p.in), k16 = paged_attention_cpu(b16);
      if (D % 16 == 0) {
        EXPECT_TRUE(torch::equal(k16, k32)) << max_diff(k16, k32);
      } else {
        // The dot-product fallback: the compiler may contract a multiply-add
        // into an FMA in one element type's loop and not the other's (an ulp).
        EXPECT_LT(max_diff(k16, k32), 2e-6);
      }
      EXPECT_LT(max_diff(k16, want), 1e-5);
      const torch::Tensor g32 = paged_attention_gather(p.in), g16 = paged_attention_gather(b16);
      EXPECT_TRUE(torch::equal(g16, g32)) << max_diff(g16, g32);
    }
  }
}

TEST_P(AttentionVariant, BfloatPoolsPropagateANanAndRefuseMixedPools) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(GetParam());
  ScopedKernelIsa scope(GetParam());
  Problem p = make_problem(2, 64, 16, {40}, {1}, 4);
  p.in.k_pool = p.in.k_pool.to(torch::kBFloat16);
  const int32_t blk = p.in.block_tables[0][1].item<int32_t>();
  p.in.v_pool.select(0, blk).select(1, 3).fill_(std::numeric_limits<float>::quiet_NaN());
  EXPECT_THROW(paged_attention_cpu(p.in), std::invalid_argument) << "fp32 V with bfloat16 K";
  p.in.v_pool = p.in.v_pool.to(torch::kBFloat16);
  EXPECT_TRUE(torch::isnan(paged_attention_cpu(p.in)).all().item<bool>());
}

INSTANTIATE_TEST_SUITE_P(Isas, AttentionVariant, ::testing::ValuesIn(all_isas()), test::isa_name);

}  // namespace
}  // namespace troupe::model
