// PrefixRootIndex (the batcher's cluster-wide index of cached first blocks),
// and BlockAllocator telling it exactly which first blocks it caches.
#include "core/prefix_root_index.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <vector>

#include "core/block_allocator.hpp"

namespace troupe::core {
namespace {

std::vector<uint64_t> sorted(const std::vector<uint64_t>* v) {
  if (v == nullptr) return {};
  std::vector<uint64_t> out = *v;
  std::sort(out.begin(), out.end());
  return out;
}

TEST(PrefixRootIndex, NamesTheWorkersHoldingAFirstBlock) {
  PrefixRootIndex ix;
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_EQ(ix.holders(a.data(), 4), nullptr);
  ix.add(7, a.data(), 4);
  ix.add(9, a.data(), 4);
  ix.add(9, b.data(), 4);
  EXPECT_EQ(sorted(ix.holders(a.data(), 4)), (std::vector<uint64_t>{7, 9}));
  EXPECT_EQ(sorted(ix.holders(b.data(), 4)), (std::vector<uint64_t>{9}));
  EXPECT_EQ(ix.holders(a.data(), 3), nullptr) << "another block size is another block";
  EXPECT_EQ(ix.size(), 3u);
  ix.remove(7, a.data(), 4);
  EXPECT_EQ(sorted(ix.holders(a.data(), 4)), (std::vector<uint64_t>{9}));
  EXPECT_THROW(ix.remove(7, a.data(), 4), std::logic_error);
  EXPECT_THROW(ix.remove(7, b.data(), 4), std::logic_error);
  ix.remove_worker(9);
  EXPECT_EQ(ix.holders(a.data(), 4), nullptr);
  EXPECT_EQ(ix.holders(b.data(), 4), nullptr);
  EXPECT_EQ(ix.size(), 0u);
}

// The observer's view (a multiset of first-block contents) must equal the
// allocator's own (a first block is one it finds with cached_prefix_length)
// through registration, eviction, name replacement and clear_cache.
TEST(PrefixRootIndex, AnAllocatorReportsExactlyTheFirstBlocksItCaches) {
  const int32_t bs = 2;
  BlockAllocator a(6, bs, true, 99);
  std::map<std::vector<int32_t>, int> seen;
  int events = 0;
  a.set_root_observer([&](const int32_t* t, bool cached) {
    ++events;
    std::vector<int32_t> key(t, t + bs);
    if (cached) {
      EXPECT_EQ(seen[key]++, 0) << "a first block reported twice";
    } else {
      ASSERT_EQ(seen[key], 1) << "a first block dropped that was never reported";
      seen.erase(key);
    }
  });
  auto expect_same = [&](const std::set<std::vector<int32_t>>& contents) {
    for (const auto& t : contents) {
      const bool held = a.cached_prefix_length(t.data(), 1) == 1;
      EXPECT_EQ(held, seen.count(t) == 1) << t[0] << "," << t[1];
    }
    for (const auto& [t, n] : seen) EXPECT_EQ(a.cached_prefix_length(t.data(), 1), 1);
  };
  std::set<std::vector<int32_t>> all;
  // Three sequences of two blocks: first blocks report, second ones do not.
  std::vector<std::vector<int32_t>> owned;
  for (int32_t s = 0; s < 3; ++s) {
    const std::vector<int32_t> t = {s, s, s + 10, s + 10};
    all.insert({s, s});
    all.insert({s + 10, s + 10});
    std::vector<int32_t> blocks;
    ASSERT_TRUE(a.allocate(2, blocks));
    const uint64_t h0 = a.hash_block(0, t.data());
    ASSERT_TRUE(a.register_block(blocks[0], -1, h0, t.data()));
    ASSERT_TRUE(a.register_block(blocks[1], blocks[0], a.hash_block(h0, t.data() + bs), t.data() + bs));
    owned.push_back(blocks);
  }
  EXPECT_EQ(events, 3);
  EXPECT_EQ(seen.size(), 3u);
  expect_same(all);
  // Released, then evicted by new allocations: each evicted first block reports.
  for (const auto& b : owned) a.release_all(b);
  std::vector<int32_t> fresh;
  ASSERT_TRUE(a.allocate(5, fresh));
  EXPECT_LT(seen.size(), 3u) << "evictions reach first blocks";
  expect_same(all);
  a.release_all(fresh);
  a.check_invariants();
  a.clear_cache();
  EXPECT_TRUE(seen.empty());
  expect_same(all);
}

}  // namespace
}  // namespace troupe::core
