#include "core/token_times.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

namespace troupe::core {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();

std::vector<int64_t> gaps_of(const TokenTimes& t) {
  std::vector<int64_t> out;
  t.for_each_gap([&](int64_t g) { out.push_back(g); });
  return out;
}

TEST(TokenTimes, EmptyHasNothing) {
  TokenTimes t;
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.begin(), t.end());
  EXPECT_TRUE(t.to_vector().empty());
  EXPECT_TRUE(gaps_of(t).empty());
  EXPECT_EQ(t, TokenTimes(std::vector<int64_t>{}));
}

TEST(TokenTimes, KeepsEveryTimeExactlyAtTheEdgesOfAGap) {
  // Gaps at and around what 4 bytes hold, backwards, and the int64 extremes
  // (whose differences overflow int64 itself).
  const std::vector<int64_t> times = {5,
                                      5,
                                      5 + kI32Max,
                                      5 + kI32Max + kI32Max + 1,
                                      10,
                                      10 + kI32Min + 1,
                                      10 + kI32Min + 1 + kI32Min,
                                      kMax,
                                      kMin,
                                      kMax,
                                      kMax - 1,
                                      0,
                                      1'000'000'000'000};
  TokenTimes t(times);
  EXPECT_EQ(t.size(), times.size());
  EXPECT_EQ(t.front(), 5);
  EXPECT_EQ(t.back(), 1'000'000'000'000);
  EXPECT_EQ(t.to_vector(), times);
  const std::vector<int64_t> gaps = gaps_of(t);
  ASSERT_EQ(gaps.size(), times.size() - 1);
  for (size_t i = 1; i < times.size(); ++i) {
    // The difference as the caller computes it (wrapping where int64 does).
    const auto want =
        static_cast<int64_t>(static_cast<uint64_t>(times[i]) - static_cast<uint64_t>(times[i - 1]));
    EXPECT_EQ(gaps[i - 1], want) << i;
  }
}

TEST(TokenTimes, MatchesAVectorOnRandomTimes) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<int64_t> want;
    TokenTimes t;
    int64_t now = static_cast<int64_t>(rng() % 1'000'000'000);
    const size_t n = rng() % 300;
    t.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      switch (rng() % 4) {
        case 0:
          now += static_cast<int64_t>(rng() % 200'000'000);
          break;  // a step
        case 1:
          now += static_cast<int64_t>(rng() % 20'000'000'000);
          break;  // a long stall
        case 2:
          now -= static_cast<int64_t>(rng() % 3'000'000'000);
          break;  // backwards
        default:
          break;  // the same time
      }
      want.push_back(now);
      t.push_back(now);
      ASSERT_EQ(t.back(), now);
    }
    EXPECT_EQ(t.size(), want.size());
    EXPECT_EQ(t.to_vector(), want) << round;
    if (!want.empty()) {
      EXPECT_EQ(t.front(), want.front());
    }
    EXPECT_EQ(t, TokenTimes(want));
  }
}

TEST(TokenTimes, EqualityIsOnTheTimes) {
  TokenTimes a(std::vector<int64_t>{1, 2, 3 + kI32Max * 4});
  TokenTimes b(std::vector<int64_t>{1, 2, 3 + kI32Max * 4});
  EXPECT_EQ(a, b);
  b.push_back(b.back());
  EXPECT_NE(a, b);
  EXPECT_NE(a, TokenTimes(std::vector<int64_t>{0, 2, 3 + kI32Max * 4}));
  EXPECT_NE(a, TokenTimes(std::vector<int64_t>{1, 2, 4 + kI32Max * 4}));
  a.clear();
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a, TokenTimes());
  a.push_back(9);
  EXPECT_EQ(a.to_vector(), std::vector<int64_t>{9});
}

}  // namespace
}  // namespace troupe::core
