#include "core/block_allocator.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>
#include <vector>

namespace troupe::core {
namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t from) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), from);
  return t;
}

// The chained names of the first n full blocks of `tokens`.
std::vector<uint64_t> names(const BlockAllocator& a, const std::vector<int32_t>& tokens, size_t n) {
  std::vector<uint64_t> hashes;
  uint64_t parent = 0;
  for (size_t i = 0; i < n; ++i) {
    parent = a.hash_block(parent, tokens.data() + i * static_cast<size_t>(a.block_size()));
    hashes.push_back(parent);
  }
  return hashes;
}

// Registers `blocks` as the chain of full blocks of `tokens`; returns the names.
std::vector<uint64_t> register_chain(BlockAllocator& a, const std::vector<int32_t>& blocks,
                                     const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> hashes = names(a, tokens, blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t* t = tokens.data() + i * static_cast<size_t>(a.block_size());
    EXPECT_TRUE(a.register_block(blocks[i], i > 0 ? blocks[i - 1] : -1, hashes[i], t)) << "block " << i;
  }
  return hashes;
}

// A deliberately weak name for tests: the block's last token, nothing else.
uint64_t last_token_name(uint64_t, uint64_t, const int32_t* tokens, int32_t n) {
  return static_cast<uint64_t>(tokens[n - 1]);
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

// Freed blocks go out again first, most recently freed first; then blocks
// never used, lowest id first. A block never handed out reads as free and
// uncached, and every operation on a used block refuses it.
TEST(BlockAllocator, FreedBlocksGoFirstThenNeverUsedOnesInIdOrder) {
  BlockAllocator a(6, 2);
  std::vector<int32_t> t{1, 2};
  for (int32_t want : {0, 1, 2}) EXPECT_EQ(a.allocate(), want);
  a.release(1);
  a.release(0);
  EXPECT_EQ(a.num_free(), 5);
  a.check_invariants();
  for (int32_t want : {0, 1, 3, 4}) EXPECT_EQ(a.allocate(), want);
  EXPECT_EQ(a.ref_count(5), 0);
  EXPECT_FALSE(a.is_cached(5));
  EXPECT_THROW(a.release(5), std::logic_error);
  EXPECT_THROW(a.share(5), std::logic_error);
  EXPECT_THROW(a.register_block(5, -1, a.hash_block(0, t.data()), t.data()), std::logic_error);
  EXPECT_THROW(a.ref_count(6), std::out_of_range);
  a.check_invariants();
  EXPECT_EQ(a.allocate(), 5);
  EXPECT_EQ(a.allocate(), -1);
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

TEST(BlockAllocator, NamesDependOnKeyParentAndTokens) {
  auto t = iota_tokens(4, 10);
  const BlockAllocator a(2, 4, true, /*hash_key=*/5), same_key(9, 4, true, 5), other_key(2, 4, true, 6);
  const uint64_t h1 = a.hash_block(0, t.data());
  EXPECT_EQ(h1, same_key.hash_block(0, t.data())) << "a name is a function of the key, not of the allocator";
  EXPECT_NE(h1, other_key.hash_block(0, t.data()));
  EXPECT_NE(h1, a.hash_block(1, t.data()));
  t[3] = 99;
  EXPECT_NE(h1, a.hash_block(0, t.data()));
  // Without a key each allocator draws its own: names are not predictable.
  const BlockAllocator r1(2, 4), r2(2, 4);
  EXPECT_NE(r1.hash_block(0, t.data()), r2.hash_block(0, t.data()));
}

TEST(BlockAllocator, FindsLongestCachedPrefixAndShares) {
  BlockAllocator a(8, 4);
  auto tokens = iota_tokens(12, 100);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(a.allocate(3, blocks));
  auto hashes = register_chain(a, blocks, tokens);
  EXPECT_EQ(a.num_cached(), 3);

  EXPECT_EQ(a.find_prefix(hashes, tokens.data(), 3), blocks);
  EXPECT_EQ(a.find_prefix(hashes, tokens.data(), 2),
            std::vector<int32_t>(blocks.begin(), blocks.begin() + 2));
  EXPECT_EQ(a.cached_prefix_length(tokens.data(), 3), 3);
  EXPECT_EQ(a.cached_prefix_length(tokens.data(), 2), 2);

  // A different second block: only the first one matches.
  auto other = tokens;
  other[5] = 7;
  EXPECT_EQ(a.find_prefix(names(a, other, 3), other.data(), 3), std::vector<int32_t>{blocks[0]});
  EXPECT_EQ(a.cached_prefix_length(other.data(), 3), 1);
  other[0] = 7;
  EXPECT_EQ(a.cached_prefix_length(other.data(), 3), 0);

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

TEST(BlockAllocator, NameMatchWithDifferentTokensIsRejected) {
  BlockAllocator a(2, 2);
  a.set_hash_function(last_token_name);
  std::vector<int32_t> t{1, 2};
  int32_t b = a.allocate();
  const uint64_t h = a.hash_block(0, t.data());
  ASSERT_TRUE(a.register_block(b, -1, h, t.data()));
  std::vector<int32_t> forged{7, 2};  // a collision: the same name, other tokens
  ASSERT_EQ(a.hash_block(0, forged.data()), h);
  EXPECT_TRUE(a.find_prefix({h}, forged.data(), 1).empty());
  EXPECT_EQ(a.cached_prefix_length(forged.data(), 1), 0);
  EXPECT_EQ(a.find_prefix({h}, t.data(), 1), std::vector<int32_t>{b});
  EXPECT_EQ(a.cached_prefix_length(t.data(), 1), 1);
}

// vLLM's GHSA-rm76-4mrf-v9r8 in miniature. A block [9, 5] whose name collides
// with the cached [1, 5] cannot be registered, so the block computed after it
// ([2, 7], K/V that depend on 9) must not become reachable as the successor of
// [1, 5]: neither by registering it under an uncached parent, nor by a lookup
// that only compares names.
TEST(BlockAllocator, CollidingParentCannotServeItsChildToAnotherPrefix) {
  BlockAllocator a(8, 2);
  a.set_hash_function(last_token_name);
  const std::vector<int32_t> victim{1, 5, 2, 7}, attacker{9, 5, 2, 7};
  std::vector<int32_t> va, vc;
  ASSERT_TRUE(a.allocate(1, va));
  register_chain(a, va, victim);  // [1, 5] only
  ASSERT_TRUE(a.allocate(2, vc));
  const auto names_c = names(a, attacker, 2);
  EXPECT_FALSE(a.register_block(vc[0], -1, names_c[0], attacker.data())) << "the name is taken";
  EXPECT_FALSE(a.register_block(vc[1], vc[0], names_c[1], attacker.data() + 2)) << "its parent is not cached";
  EXPECT_EQ(a.find_prefix(names(a, victim, 2), victim.data(), 2), va);

  // Even a child registered under a cached parent is only found after that
  // very parent, whatever the names say.
  BlockAllocator b(8, 2);
  b.set_hash_function(last_token_name);
  std::vector<int32_t> p1, p2;
  ASSERT_TRUE(b.allocate(1, p1));
  ASSERT_TRUE(b.allocate(2, p2));
  const std::vector<int32_t> first{1, 5}, second{3, 6, 2, 7};
  ASSERT_TRUE(b.register_block(p1[0], -1, 5, first.data()));
  ASSERT_TRUE(b.register_block(p2[0], -1, 6, second.data()));
  ASSERT_TRUE(b.register_block(p2[1], p2[0], 7, second.data() + 2));
  EXPECT_EQ(b.find_prefix({5, 7}, victim.data(), 2), p1) << "[2, 7] was computed after [3, 6], not [1, 5]";
  EXPECT_EQ(b.cached_prefix_length(victim.data(), 2), 1) << "placement counts by the same rule";
  b.check_invariants();
}

TEST(BlockAllocator, ChildOfARecycledParentIsUnreachableAndItsNameReclaimed) {
  BlockAllocator a(3, 2);
  const std::vector<int32_t> t{1, 2, 3, 4};
  std::vector<int32_t> blocks;
  ASSERT_TRUE(a.allocate(2, blocks));
  const auto hashes = register_chain(a, blocks, t);
  a.release(blocks[0]);  // the parent goes first to the LRU head
  a.release(blocks[1]);
  const int32_t clean = a.allocate();  // the clean block
  EXPECT_EQ(a.allocate(), blocks[0]);  // evicts the parent: its child is now an orphan
  EXPECT_FALSE(a.is_cached(blocks[0]));
  EXPECT_TRUE(a.is_cached(blocks[1]));
  // The same tokens computed again into the recycled block: same name, new contents.
  ASSERT_TRUE(a.register_block(blocks[0], -1, hashes[0], t.data()));
  EXPECT_EQ(a.find_prefix(hashes, t.data(), 2), std::vector<int32_t>{blocks[0]})
      << "the old child was computed after the parent's old contents";
  // A new child takes the orphan's name (the orphan is unused).
  ASSERT_TRUE(a.register_block(clean, blocks[0], hashes[1], t.data() + 2));
  EXPECT_FALSE(a.is_cached(blocks[1]));
  EXPECT_EQ(a.find_prefix(hashes, t.data(), 2), (std::vector<int32_t>{blocks[0], clean}));
  a.check_invariants();
}

TEST(BlockAllocator, DuplicateNameKeepsTheFirstBlock) {
  BlockAllocator a(4, 2);
  std::vector<int32_t> t{5, 6};
  const uint64_t h = a.hash_block(0, t.data());
  int32_t b1 = a.allocate(), b2 = a.allocate();
  EXPECT_TRUE(a.register_block(b1, -1, h, t.data()));
  EXPECT_FALSE(a.register_block(b2, -1, h, t.data()));
  EXPECT_FALSE(a.register_block(b1, -1, h, t.data()));
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
  const uint64_t h = a.hash_block(0, t.data());
  EXPECT_FALSE(a.register_block(b, -1, h, t.data()));
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
}  // namespace troupe::core
