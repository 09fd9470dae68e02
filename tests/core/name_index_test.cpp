// NameIndex against std::unordered_map under random inserts and erases,
// with keys chosen to crowd a few home slots (long probe runs that wrap
// around the array, so backward-shift deletion is exercised).
#include "core/name_index.hpp"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace troupe::core {
namespace {

TEST(NameIndex, AgreesWithAMapUnderRandomInsertsAndErases) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    NameIndex index;
    std::unordered_map<uint64_t, int32_t> want;
    // Few distinct keys (so erases hit) from several shapes: small integers
    // (a weak test hash), multiples of 2^58 (differ only in high bits), and
    // random 64-bit names.
    auto key = [&]() -> uint64_t {
      const uint64_t r = rng() % 48;
      if (r < 16) return r;
      if (r < 32) return (r - 16) << 58;
      return (0x9E3779B97F4A7C15ULL * (r - 31)) ^ 0xdeadbeefULL;
    };
    for (int step = 0; step < 20000; ++step) {
      const uint64_t k = key();
      const int32_t id = static_cast<int32_t>(rng() % 1000);
      switch (rng() % 3) {
        case 0: {
          const bool fresh = want.emplace(k, id).second;
          ASSERT_EQ(index.insert(k, id), fresh) << "step " << step;
          break;
        }
        case 1:
          ASSERT_EQ(index.erase(k), want.erase(k) == 1) << "step " << step;
          break;
        default: {
          auto it = want.find(k);
          ASSERT_EQ(index.find(k), it == want.end() ? -1 : it->second) << "step " << step;
        }
      }
      ASSERT_EQ(index.size(), want.size());
    }
    for (const auto& [k, v] : want) EXPECT_EQ(index.find(k), v);
  }
}

TEST(NameIndex, GrowsAndKeepsEveryEntry) {
  NameIndex index;
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.find(0), -1);
  EXPECT_FALSE(index.erase(0));
  for (int32_t i = 0; i < 5000; ++i) ASSERT_TRUE(index.insert(static_cast<uint64_t>(i) * 7919, i));
  EXPECT_FALSE(index.insert(7919, 5)) << "a name is stored once";
  EXPECT_EQ(index.size(), 5000u);
  for (int32_t i = 0; i < 5000; ++i) ASSERT_EQ(index.find(static_cast<uint64_t>(i) * 7919), i);
  for (int32_t i = 0; i < 5000; i += 2) ASSERT_TRUE(index.erase(static_cast<uint64_t>(i) * 7919));
  for (int32_t i = 0; i < 5000; ++i)
    ASSERT_EQ(index.find(static_cast<uint64_t>(i) * 7919), i % 2 ? i : -1) << i;
}

}  // namespace
}  // namespace troupe::core
