// Mapping the KV pools ahead of the blocks in use: the policy's arithmetic,
// the prefaulter's thread on real anonymous memory (mincore: exact, no
// timing), and PagedKvCache::map_ahead on a GPT-2-sized pool.
#include "model/kv_prefault.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "model/config.hpp"
#include "model/paged_kv_cache.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

using test::kernel_populates;
using test::resident_bytes;

TEST(KvPrefault, TheSettingIsZeroOneOrAll) {
  EXPECT_EQ(kv_prefault_from(nullptr), KvPrefault::kAhead);
  EXPECT_EQ(kv_prefault_from("1"), KvPrefault::kAhead);
  EXPECT_EQ(kv_prefault_from("0"), KvPrefault::kOff);
  EXPECT_EQ(kv_prefault_from("all"), KvPrefault::kWhole);
  for (const char* bad : {"", "2", "on", "yes", " 1", "ALL", "all "}) {
    try {
      kv_prefault_from(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("TROUPE_KV_PREFAULT"), std::string::npos) << e.what();
    }
  }
}

TEST(KvPrefaultPolicy, AsksForTheEndOfTheHighestBlockPlusTheMarginInWholePages) {
  // A pool of 100 blocks of 3 bytes, 4 bytes ahead, pages of 8 bytes: 300 bytes.
  KvPrefaultPolicy p(300, 3, 4, 8);
  EXPECT_EQ(p.asked(), 0);
  EXPECT_EQ(p.on_write(-1), 8);  // at the start: the margin, one page
  EXPECT_EQ(p.on_write(-1), 0);  // asked already
  EXPECT_EQ(p.on_write(0), 0);   // block 0 ends at 3, + 4 = 7: within the page asked for
  EXPECT_EQ(p.on_write(1), 16);  // ends at 6, + 4 = 10: the next page
  EXPECT_EQ(p.on_write(0), 0);   // lower blocks (reused ones) never ask for less
  EXPECT_EQ(p.on_write(3), 0);   // 12 + 4 = 16
  EXPECT_EQ(p.on_write(4), 24);  // 15 + 4 = 19
  EXPECT_EQ(p.asked(), 24);
  EXPECT_EQ(p.on_write(98), 300);  // 297 + 4 past the pool: the pool, not a whole page more
  EXPECT_EQ(p.on_write(99), 0);
  EXPECT_EQ(p.on_write(1000), 0);  // a block past the pool asks for nothing more
  EXPECT_EQ(p.asked(), 300);
  EXPECT_EQ(KvPrefaultPolicy(0, 3, 4, 8).on_write(5), 0);  // an empty pool: nothing to map
  EXPECT_THROW(KvPrefaultPolicy(300, 0, 4, 8), std::invalid_argument);
  EXPECT_THROW(KvPrefaultPolicy(300, 3, -1, 8), std::invalid_argument);
  EXPECT_THROW(KvPrefaultPolicy(300, 3, 4, 0), std::invalid_argument);
  EXPECT_THROW(KvPrefaultPolicy(-1, 3, 4, 8), std::invalid_argument);
}

// Three untouched ranges of 8 MiB: a request maps every range's prefix, and
// no more, on the prefaulter's thread; the contents stay zero.
TEST(PagePrefaulter, MapsEveryRangesPrefixAndNothingPastIt) {
  const size_t len = static_cast<size_t>(8 * kMiB);
  std::vector<void*> maps;
  std::vector<std::pair<char*, size_t>> ranges;
  for (int i = 0; i < 3; ++i) {
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    madvise(m, len, MADV_NOHUGEPAGE);  // 4 KiB pages: residency exact to the byte asked for
    maps.push_back(m);
    ranges.emplace_back(static_cast<char*>(m), len);
    ASSERT_EQ(resident_bytes(m, len), 0);
  }
  if (!kernel_populates()) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)";
  {
    PagePrefaulter pf(ranges, static_cast<size_t>(kMiB));
    pf.request(static_cast<size_t>(3 * kMiB));
    pf.wait();
    EXPECT_FALSE(pf.failed());
    EXPECT_EQ(pf.done(), static_cast<size_t>(3 * kMiB));
    for (void* m : maps) EXPECT_EQ(resident_bytes(m, len), 3 * kMiB);
    pf.request(static_cast<size_t>(2 * kMiB));    // less than asked before: nothing
    pf.request(static_cast<size_t>(100 * kMiB));  // past the ranges: up to their end
    pf.wait();
    EXPECT_EQ(pf.done(), len);
    for (void* m : maps) EXPECT_EQ(resident_bytes(m, len), static_cast<int64_t>(len));
  }
  for (void* m : maps) {
    const auto* c = static_cast<const unsigned char*>(m);
    EXPECT_EQ(c[0] | c[len / 2] | c[len - 1], 0);
    munmap(m, len);
  }
}

// A prefaulter asked for nothing starts no thread and stops at once; one
// destroyed mid-request stops at the piece it is on.
TEST(PagePrefaulter, StopsWhenDestroyed) {
  const size_t len = static_cast<size_t>(64 * kMiB);
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  { PagePrefaulter idle({{static_cast<char*>(m), len}}); }
  madvise(m, len, MADV_NOHUGEPAGE);
  {
    PagePrefaulter pf({{static_cast<char*>(m), len}}, static_cast<size_t>(kMiB));
    pf.request(len);
  }  // joined here, wherever it was: nothing maps pages after
  const int64_t after = resident_bytes(m, len);
  usleep(100'000);
  EXPECT_EQ(resident_bytes(m, len), after);
  munmap(m, len);
}

// GPT-2 124M's pools (2048 blocks of 16 tokens: 96 MiB each): map_ahead
// maps every pool past the highest block written, in whole 2 MiB pages, and
// leaves the rest untouched.
TEST(PagedKvCache, MapAheadMapsEveryPoolPastTheHighestBlock) {
  if (!kernel_populates()) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)";
  const Gpt2Config cfg = Gpt2Config::preset("gpt2");
  PagedKvCache cache(cfg, 2048, 16);
  const int64_t block = cfg.n_head * 16 * cfg.head_dim() * 4;  // 48 KiB of one pool
  const size_t pool = static_cast<size_t>(block * 2048);
  EXPECT_EQ(cache.mapped_ahead_bytes(), 0);
  EXPECT_EQ(resident_bytes(cache.k(0).data_ptr(), pool), 0);  // nothing before it is asked
  cache.map_ahead(100);  // block 100 ends at 4.73 MiB; + 10 blocks (480 KiB): 6 MiB
  EXPECT_EQ(cache.mapped_ahead_bytes(), 6 * kMiB);
  cache.wait_mapped();
  for (int l = 0; l < cfg.n_layer; ++l) {
    for (const torch::Tensor* t : {&cache.k(l), &cache.v(l)}) {
      const char* p = static_cast<const char*>(t->data_ptr());
      EXPECT_EQ(resident_bytes(p, static_cast<size_t>(6 * kMiB)), 6 * kMiB) << "layer " << l;
      EXPECT_EQ(resident_bytes(p + 6 * kMiB, pool - static_cast<size_t>(6 * kMiB)), 0) << "layer " << l;
    }
  }
  cache.map_ahead(50);  // lower: nothing new
  EXPECT_EQ(cache.mapped_ahead_bytes(), 6 * kMiB);
  cache.map_ahead(2047);  // the last block: the whole pool
  EXPECT_EQ(cache.mapped_ahead_bytes(), static_cast<int64_t>(pool));
}

// TROUPE_KV_PREFAULT=all: every pool resident, to its last byte, once what
// map_whole() asked for is done; the contents still zero; map_ahead asks for
// nothing after.
TEST(PagedKvCache, MapWholeMapsEveryPoolToItsEnd) {
  if (!kernel_populates()) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)";
  const Gpt2Config cfg = Gpt2Config::preset("gpt2");
  PagedKvCache cache(cfg, 100, 16, torch::kCPU, KvDtype::kBFloat16);  // 2.34 MiB a pool: not whole pages
  const size_t pool = static_cast<size_t>(cfg.n_head * 16 * cfg.head_dim() * 2 * 100);
  EXPECT_EQ(resident_bytes(cache.v(cfg.n_layer - 1).data_ptr(), pool), 0);
  cache.map_whole();
  EXPECT_EQ(cache.mapped_ahead_bytes(), static_cast<int64_t>(pool));
  cache.wait_mapped();
  for (int l = 0; l < cfg.n_layer; ++l) {
    for (const torch::Tensor* t : {&cache.k(l), &cache.v(l)}) {
      EXPECT_EQ(resident_bytes(t->data_ptr(), pool), static_cast<int64_t>(pool)) << "layer " << l;
      EXPECT_EQ(t->abs().max().item<float>(), 0.0f) << "layer " << l;
    }
  }
  cache.map_ahead(0);
  EXPECT_EQ(cache.mapped_ahead_bytes(), static_cast<int64_t>(pool));
}

}  // namespace
}  // namespace troupe::model
