#include "model/block_allocator.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>
#include <vector>

namespace troupe::model {
namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t from) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), from);
  return t;
}

// Registers `blocks` as the chain of full blocks of `tokens`; returns the hashes.
std::vector<uint64_t> register_chain(BlockAllocator& a, const std::vector<int32_t>& blocks,
                                     const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> hashes;
  uint64_t parent = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t* t = tokens.data() + i * static_cast<size_t>(a.block_size());
    uint64_t h = BlockAllocator::hash_block(parent, t, a.block_size());
    a.register_block(blocks[i], h, parent, t);
    hashes.push_back(h);
    parent = h;
  }
  return hashes;
}

TEST(BlockAllocator, AllocatesAllBlocksThenRunsOut) {
  BlockAllocator a(4, 16);
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(a.allocate());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(a.allocate(), -1);
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_EQ(a.num_used(), 4);
  a.release(2);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.allocate(), 2);
  a.check_invariants();
}

TEST(BlockAllocator, BulkAllocateIsAllOrNothing) {
  BlockAllocator a(3, 4);
  std::vector<int32_t> out;
  EXPECT_FALSE(a.allocate(4, out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(a.num_free(), 3);
  EXPECT_TRUE(a.allocate(3, out));
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(a.num_free(), 0);
  a.check_invariants();
}

TEST(BlockAllocator, ReleasingAFreeBlockThrows) {
  BlockAllocator a(2, 4);
  int32_t b = a.allocate();
  a.release(b);
  EXPECT_THROW(a.release(b), std::logic_error);
  EXPECT_THROW(a.release(7), std::out_of_range);
  EXPECT_THROW(BlockAllocator(0, 4), std::invalid_argument);
}

TEST(BlockAllocator, ChainedHashDependsOnParentAndTokens) {
  auto t = iota_tokens(4, 10);
  uint64_t h1 = BlockAllocator::hash_block(0, t.data(), 4);
  EXPECT_EQ(h1, BlockAllocator::hash_block(0, t.data(), 4));
  EXPECT_NE(h1, BlockAllocator::hash_block(1, t.data(), 4));
  t[3] = 99;
  EXPECT_NE(h1, BlockAllocator::hash_block(0, t.data(), 4));
}

TEST(BlockAllocator, FindsLongestCachedPrefixAndShares) {
  BlockAllocator a(8, 4);
  auto tokens = iota_tokens(12, 100);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(a.allocate(3, blocks));
  auto hashes = register_chain(a, blocks, tokens);
  EXPECT_EQ(a.num_cached(), 3);

  EXPECT_EQ(a.find_prefix(hashes, tokens.data(), 3), blocks);
  EXPECT_EQ(a.find_prefix(hashes, tokens.data(), 2), std::vector<int32_t>(blocks.begin(), blocks.begin() + 2));

  // A different second block: only the first one matches.
  auto other = tokens;
  other[5] = 7;
  std::vector<uint64_t> other_hashes;
  uint64_t parent = 0;
  for (int i = 0; i < 3; ++i) {
    parent = BlockAllocator::hash_block(parent, other.data() + i * 4, 4);
    other_hashes.push_back(parent);
  }
  EXPECT_EQ(a.find_prefix(other_hashes, other.data(), 3), std::vector<int32_t>{blocks[0]});

  // Sharing bumps refs; releasing both owners leaves the blocks cached and evictable.
  for (int32_t b : blocks) a.share(b);
  EXPECT_EQ(a.ref_count(blocks[0]), 2);
  a.release_all(blocks);
  EXPECT_EQ(a.num_evictable(), 0);
  a.release_all(blocks);
  EXPECT_EQ(a.num_evictable(), 3);
  EXPECT_EQ(a.num_free(), 8);
  EXPECT_EQ(a.find_prefix(hashes, tokens.data(), 3), blocks);
  // Sharing a block from the LRU takes it out of the free count.
  a.share(blocks[0]);
  EXPECT_EQ(a.num_free(), 7);
  EXPECT_EQ(a.num_evictable(), 2);
  a.check_invariants();
}

TEST(BlockAllocator, HashMatchWithDifferentTokensIsRejected) {
  BlockAllocator a(2, 2);
  std::vector<int32_t> t{1, 2};
  int32_t b = a.allocate();
  uint64_t h = BlockAllocator::hash_block(0, t.data(), 2);
  ASSERT_TRUE(a.register_block(b, h, 0, t.data()));
  std::vector<int32_t> forged{1, 3};  // pretend a collision: same hash, other tokens
  EXPECT_TRUE(a.find_prefix({h}, forged.data(), 1).empty());
  EXPECT_EQ(a.find_prefix({h}, t.data(), 1).size(), 1u);
}

TEST(BlockAllocator, DuplicateHashKeepsTheFirstBlock) {
  BlockAllocator a(4, 2);
  std::vector<int32_t> t{5, 6};
  uint64_t h = BlockAllocator::hash_block(0, t.data(), 2);
  int32_t b1 = a.allocate(), b2 = a.allocate();
  EXPECT_TRUE(a.register_block(b1, h, 0, t.data()));
  EXPECT_FALSE(a.register_block(b2, h, 0, t.data()));
  EXPECT_FALSE(a.register_block(b1, h, 0, t.data()));
  EXPECT_TRUE(a.is_cached(b1));
  EXPECT_FALSE(a.is_cached(b2));
  a.release(b2);  // uncached: straight back to the clean list
  EXPECT_EQ(a.num_evictable(), 0);
  a.check_invariants();
}

TEST(BlockAllocator, CleanBlocksGoFirstThenLeastRecentlyReleasedCachedOne) {
  BlockAllocator a(4, 2);
  auto tokens = iota_tokens(6, 0);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(a.allocate(3, blocks));  // 0, 1, 2
  auto hashes = register_chain(a, blocks, tokens);
  a.release(blocks[1]);  // LRU order: 1, then 0, then 2
  a.release(blocks[0]);
  a.release(blocks[2]);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.allocate(), 3);  // the clean block first
  EXPECT_EQ(a.evictions(), 0);
  EXPECT_EQ(a.allocate(), 1);  // then the least recently released cached block
  EXPECT_EQ(a.evictions(), 1);
  EXPECT_FALSE(a.is_cached(1));
  EXPECT_EQ(a.num_cached(), 2);
  // The chain is broken at block 1: only block 0 is still found.
  EXPECT_EQ(a.find_prefix(hashes, tokens.data(), 3), std::vector<int32_t>{0});
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), 2);
  EXPECT_EQ(a.allocate(), -1);
  a.check_invariants();
}

TEST(BlockAllocator, ReleaseAllEvictsTheTailOfASequenceFirst) {
  BlockAllocator a(3, 2);
  auto tokens = iota_tokens(6, 0);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(a.allocate(3, blocks));
  register_chain(a, blocks, tokens);
  a.release_all(blocks);
  EXPECT_EQ(a.allocate(), blocks[2]);
  EXPECT_EQ(a.allocate(), blocks[1]);
  EXPECT_EQ(a.allocate(), blocks[0]);
}

TEST(BlockAllocator, WithoutPrefixCachingNothingIsCached) {
  BlockAllocator a(2, 2, /*enable_prefix_caching=*/false);
  std::vector<int32_t> t{1, 2};
  int32_t b = a.allocate();
  uint64_t h = BlockAllocator::hash_block(0, t.data(), 2);
  EXPECT_FALSE(a.register_block(b, h, 0, t.data()));
  EXPECT_TRUE(a.find_prefix({h}, t.data(), 1).empty());
  a.release(b);
  EXPECT_EQ(a.num_evictable(), 0);
}

TEST(BlockAllocator, ClearCacheForgetsHashesButKeepsOwners) {
  BlockAllocator a(3, 2);
  auto tokens = iota_tokens(4, 0);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(a.allocate(2, blocks));
  auto hashes = register_chain(a, blocks, tokens);
  a.release(blocks[1]);
  a.clear_cache();
  EXPECT_EQ(a.num_cached(), 0);
  EXPECT_EQ(a.num_evictable(), 0);
  EXPECT_EQ(a.ref_count(blocks[0]), 1);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_TRUE(a.find_prefix(hashes, tokens.data(), 2).empty());
  a.check_invariants();
}

TEST(BlockAllocator, CountsLookups) {
  BlockAllocator a(2, 2);
  a.record_lookup(5, 3);
  a.record_lookup(2, 0);
  EXPECT_EQ(a.hit_blocks(), 3);
  EXPECT_EQ(a.miss_blocks(), 4);
}

}  // namespace
}  // namespace troupe::model
