// PagedKvCache: sizes, slot writes (CPU and torch-ops paths), and that the
// pools cost resident memory only where blocks are written.
#include "model/paged_kv_cache.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>

#include "model/config.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

using test::resident_bytes;

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

// a and b hold the same values, NaN where the other has NaN.
bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return at::allclose(a.to(torch::kFloat32), b.to(torch::kFloat32), 0.0, 0.0, /*equal_nan=*/true);
}

// A bfloat16 cache: half the bytes (twice the blocks in the same memory), K
// and V rounded as torch rounds them (to nearest, ties to even; NaN and
// infinities kept), the same on the CPU path and the torch-ops path.
TEST(PagedKvCache, BfloatCacheHalvesTheBytesAndRoundsAsTorchDoes) {
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  PagedKvCache cache(cfg, 6, 4, torch::kCPU, KvDtype::kBFloat16);
  EXPECT_EQ(cache.dtype(), KvDtype::kBFloat16);
  EXPECT_EQ(cache.k(0).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(PagedKvCache::bytes_per_block(cfg, 4, KvDtype::kBFloat16), 2 * 2 * 4 * 64 * 2);
  EXPECT_EQ(cache.bytes(), 6 * 2 * 2 * 4 * 64 * 2);
  EXPECT_EQ(PagedKvCache::blocks_for_memory(Gpt2Config::preset("gpt2"), int64_t(1) << 30, 16, KvDtype::kBFloat16),
            1820);
  torch::Tensor k = torch::randn({3, 2, 32}) * 3, v = torch::randn({3, 2, 32});
  // Ties and specials: 1 + 2^-8 is halfway between two bfloat16s (rounds to
  // even: 1), 1 + 3 x 2^-8 rounds up; NaN, infinity, the largest float.
  k[0][0][0] = 1.0f + 1.0f / 256;
  k[0][0][1] = 1.0f + 3.0f / 256;
  k[0][0][2] = std::numeric_limits<float>::quiet_NaN();
  k[0][0][3] = -std::numeric_limits<float>::infinity();
  k[0][0][4] = std::numeric_limits<float>::max();
  const torch::Tensor slots = torch::tensor(std::vector<int64_t>{21, 0, 10}, torch::kLong);
  cache.write(1, slots, k, v);
  const int64_t want_slot[3] = {21, 0, 10};
  for (int64_t t = 0; t < 3; ++t) {
    const int64_t blk = want_slot[t] / 4, off = want_slot[t] % 4;
    const torch::Tensor got = cache.k(1).select(0, blk).select(1, off);
    const torch::Tensor want = k[t].to(torch::kBFloat16);
    // Values, NaN equal to NaN (torch's vectorised conversion writes another NaN's bits than c10's scalar one).
    EXPECT_TRUE(same(got, want)) << "token " << t;
    EXPECT_TRUE(torch::equal(cache.v(1).select(0, blk).select(1, off), v[t].to(torch::kBFloat16)));
  }
  EXPECT_EQ(cache.k(1)[5][0][1][0].item<float>(), 1.0f);
  EXPECT_EQ(cache.k(1)[5][0][1][1].item<float>(), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(cache.k(1)[5][0][1][2].item<float>()));
  PagedKvCache portable(cfg, 6, 4, torch::kCPU, KvDtype::kBFloat16);
  portable.write_with_torch_ops(1, slots, k, v);
  EXPECT_TRUE(same(portable.k(1), cache.k(1)));
  EXPECT_TRUE(torch::equal(portable.v(1), cache.v(1)));
}

TEST(PagedKvCache, KvDtypeNames) {
  EXPECT_EQ(parse_kv_cache_dtype("auto", WeightDtype::kFloat32), KvDtype::kFloat32);
  EXPECT_EQ(parse_kv_cache_dtype("auto", WeightDtype::kBFloat16), KvDtype::kBFloat16);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16", WeightDtype::kFloat32), KvDtype::kBFloat16);
  EXPECT_EQ(parse_kv_cache_dtype("bf16", WeightDtype::kFloat32), KvDtype::kBFloat16);
  EXPECT_EQ(parse_kv_cache_dtype("float32", WeightDtype::kBFloat16), KvDtype::kFloat32);
  EXPECT_THROW(parse_kv_cache_dtype("fp8", WeightDtype::kFloat32), std::invalid_argument);
  EXPECT_STREQ(to_string(KvDtype::kBFloat16), "bfloat16");
  EXPECT_EQ(element_bytes(KvDtype::kFloat32), 4);
}

TEST(PagedKvCache, PoolsAreResidentOnlyWhereBlocksAreWritten) {
  const Gpt2Config cfg = Gpt2Config::preset("gpt2");  // a block of 16 tokens: 48 KiB per pool
  PagedKvCache cache(cfg, 2048, 16);                  // 96 MiB per pool, 2.25 GiB in all
  const size_t pool_bytes = static_cast<size_t>(cache.k(0).numel()) * sizeof(float);
  for (int l = 0; l < cfg.n_layer; ++l) {
    ASSERT_EQ(resident_bytes(cache.k(l).data_ptr(), pool_bytes), 0) << "layer " << l;
    ASSERT_EQ(resident_bytes(cache.v(l).data_ptr(), pool_bytes), 0) << "layer " << l;
  }
  // One token into block 1000 of layer 3: that block's pages (at most one
  // transparent huge page where THP is "always"), nothing else.
  const torch::Tensor kv = at::randn({1, cfg.n_head, cfg.head_dim()});
  cache.write(3, torch::tensor(std::vector<int64_t>{1000 * 16 + 5}, torch::kLong), kv, kv);
  const int64_t touched = resident_bytes(cache.k(3).data_ptr(), pool_bytes);
  EXPECT_GT(touched, 0);
  EXPECT_LE(touched, int64_t{4} << 20);
  EXPECT_EQ(resident_bytes(cache.k(2).data_ptr(), pool_bytes), 0);
  EXPECT_TRUE(at::equal(cache.k(3)[1000].select(1, 5), kv[0]));
}

}  // namespace
}  // namespace troupe::model
