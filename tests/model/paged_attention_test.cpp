// PagedKvCache and the two paged-attention paths (in-place CPU kernel and
// portable gather) against a plain-loop reference.
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

#include "model/config.hpp"
#include "model/paged_attention.hpp"
#include "model/paged_kv_cache.hpp"

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

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(PagedAttention, KernelAndGatherMatchPlainLoops) {
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
        EXPECT_LT(max_diff(kernel, gather), 1e-5);
        EXPECT_LT(max_diff(kernel, want), 1e-5);
        EXPECT_LT(max_diff(gather, want), 1e-5);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 18);
}

TEST(PagedAttention, RandomContextsAgreeBetweenKernelAndGather) {
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

TEST(PagedAttention, KernelReadsOnlyTheSlotsOfTheContext) {
  // Every slot outside the sequences' contexts holds NaN: one stray read shows.
  const Problem p = make_problem(4, 64, 16, {40, 7, 16}, {1, 7, 3}, 3, std::numeric_limits<float>::quiet_NaN());
  const torch::Tensor got = paged_attention_cpu(p.in);
  EXPECT_TRUE(torch::isfinite(got).all().item<bool>());
  EXPECT_LT(max_diff(got, reference(p)), 1e-5);
}

TEST(PagedAttention, KernelRunsSameOnOneOrManyThreads) {
  const Problem p = make_problem(12, 64, 16, {500, 3, 129, 64}, {1, 3, 40, 1}, 9);
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  const torch::Tensor one = paged_attention_cpu(p.in);
  at::set_num_threads(std::max(2, saved));
  const torch::Tensor many = paged_attention_cpu(p.in);
  at::set_num_threads(saved);
  EXPECT_TRUE(torch::equal(one, many));
}

TEST(PagedKvCache, SizesAndValidation) {
  const Gpt2Config cfg = Gpt2Config::preset("tiny");  // 2 layers, width 64
  PagedKvCache cache(cfg, 10, 8);
  EXPECT_EQ(cache.num_blocks(), 10);
  EXPECT_EQ(cache.block_size(), 8);
  EXPECT_EQ(cache.num_slots(), 80);
  EXPECT_EQ(PagedKvCache::bytes_per_block(cfg, 8), 2 * 2 * 8 * 64 * 4);
  EXPECT_EQ(cache.bytes(), 10 * 2 * 2 * 8 * 64 * 4);
  EXPECT_EQ(cache.k(1).sizes(), (std::vector<int64_t>{10, 2, 8, 32}));
  EXPECT_EQ(PagedKvCache::blocks_for_memory(cfg, 10 * 8192 + 8191, 8), 10);
  EXPECT_EQ(PagedKvCache::blocks_for_memory(cfg, 100, 8), 0);
  EXPECT_EQ(PagedKvCache::blocks_for_memory(Gpt2Config::preset("gpt2"), int64_t(1) << 30, 16), 910);
  EXPECT_THROW(PagedKvCache(cfg, 0, 8), std::invalid_argument);
  EXPECT_THROW(PagedKvCache(cfg, 4, 0), std::invalid_argument);
  EXPECT_THROW(PagedKvCache::blocks_for_memory(cfg, -1, 8), std::invalid_argument);
  EXPECT_THROW(PagedKvCache::blocks_for_memory(cfg, 1000, 0), std::invalid_argument);
}

TEST(PagedKvCache, WritePutsEachTokenInItsSlot) {
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  PagedKvCache cache(cfg, 6, 4);
  const torch::Tensor qkv = torch::randn({3, 3 * 64});  // strided views, as the model passes them
  const torch::Tensor k = qkv.slice(1, 64, 128).view({3, 2, 32});
  const torch::Tensor v = qkv.slice(1, 128, 192).view({3, 2, 32});
  const torch::Tensor slots = torch::tensor(std::vector<int64_t>{21, 0, 10}, torch::kLong);
  cache.write(1, slots, k, v);
  const int64_t want_slot[3] = {21, 0, 10};
  for (int64_t t = 0; t < 3; ++t) {
    const int64_t blk = want_slot[t] / 4, off = want_slot[t] % 4;
    EXPECT_TRUE(torch::equal(cache.k(1).select(0, blk).select(1, off), k[t]));
    EXPECT_TRUE(torch::equal(cache.v(1).select(0, blk).select(1, off), v[t]));
  }
  EXPECT_EQ(cache.k(0).abs().sum().item<float>(), 0.f);
  EXPECT_EQ(cache.k(1).ne(0).sum().item<int64_t>(), 3 * 2 * 32);
  EXPECT_THROW(cache.write(1, torch::tensor(std::vector<int64_t>{24, 0, 1}, torch::kLong), k, v),
               std::invalid_argument);
  EXPECT_THROW(cache.write(1, torch::tensor(std::vector<int64_t>{-1, 0, 1}, torch::kLong), k, v),
               std::invalid_argument);
  PagedKvCache portable(cfg, 6, 4);
  portable.write_with_torch_ops(1, slots, k, v);
  EXPECT_TRUE(torch::equal(portable.k(1), cache.k(1)));
  EXPECT_TRUE(torch::equal(portable.v(1), cache.v(1)));
  EXPECT_EQ(portable.k(0).abs().sum().item<float>(), 0.f);
  EXPECT_THROW(cache.write(2, slots, k, v), std::invalid_argument);
  EXPECT_THROW(cache.write(0, slots.slice(0, 0, 2), k, v), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::model
