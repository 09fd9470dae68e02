#include "model/text/stop_matcher.hpp"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::model {
namespace {

// Pushes the pieces, then flushes; returns everything emitted.
std::string stream(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  return out + m.flush();
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("hello "), "hello ");
  EXPECT_EQ(m.push("world"), "world");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, StopInsideOneDeltaTruncatesAndEndsTheStream) {
  StopMatcher m({"wor"});
  EXPECT_EQ(m.push("hello world"), "hello ");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, StopSpanningDeltasIsHeldBackThenDropped) {
  StopMatcher m({"lo w"});
  EXPECT_EQ(m.push("hel"), "he");  // "l" might start "lo w"
  EXPECT_EQ(m.push("lo"), "l");    // "lo" might too
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.push(" wo"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xab"), "x");
  EXPECT_EQ(m.push("x"), "abx");
  EXPECT_EQ(m.push("ab"), "");
  EXPECT_EQ(m.flush(), "ab");  // the stream ended before "abc" completed
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, OverlappingStopsPickTheEarliest) {
  StopMatcher a({"abc", "ab"});
  EXPECT_EQ(stream(a, {"xa", "b", "c"}), "x");
  EXPECT_TRUE(a.matched());
  StopMatcher b({"abc", "bcd"});
  EXPECT_EQ(stream(b, {"x", "b", "c", "d", "e"}), "x");
  StopMatcher c({"bcd", "abc"});
  EXPECT_EQ(stream(c, {"zabcd"}), "z");
  StopMatcher d({"aab"});
  EXPECT_EQ(stream(d, {"a", "a", "a", "b", "c"}), "a");
}

TEST(StopMatcher, MultiByteUtf8) {
  StopMatcher m({"\xC3\xA9"});  // é
  EXPECT_EQ(stream(m, {"caf", "\xC3\xA9 au lait"}), "caf");
  // ü shares é's lead byte but is not a stop.
  StopMatcher n({"\xC3\xA9"});
  EXPECT_EQ(stream(n, {"\xC3\xBC", "ber"}), "\xC3\xBC" "ber");
  StopMatcher j({"日本"});
  std::string out = j.push("今日");
  EXPECT_EQ(out, "今");  // "日" is held: it starts "日本"
  out += j.push("は日");
  EXPECT_EQ(out, "今日は");
  out += j.push("本です");
  EXPECT_EQ(out, "今日は");
  EXPECT_TRUE(j.matched());
}

TEST(StopMatcher, EmptyStopStringIsRejected) {
  EXPECT_THROW(StopMatcher({"ok", ""}), std::invalid_argument);
}

// Streaming semantics: the stream stops at the first piece after which the
// text holds a stop string, and is cut where the earliest one present starts.
TEST(StopMatcher, AnySplitMatchesTheStreamingDefinition) {
  std::mt19937 rng(42);
  auto random_string = [&](size_t min_len, size_t max_len) {
    std::string s(std::uniform_int_distribution<size_t>(min_len, max_len)(rng), 'a');
    for (auto& c : s) c = "abc"[std::uniform_int_distribution<int>(0, 2)(rng)];
    return s;
  };
  int matched = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    for (int i = std::uniform_int_distribution<int>(1, 3)(rng); i > 0; --i) stops.push_back(random_string(1, 4));
    const std::string text = random_string(0, 30);
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t len = std::uniform_int_distribution<size_t>(0, 5)(rng);
      pieces.push_back(text.substr(at, len));
      at += len;
    }
    std::string expected, seen;
    size_t cut = std::string::npos;
    for (const auto& p : pieces) {
      seen += p;
      for (const auto& s : stops) cut = std::min(cut, seen.find(s));
      if (cut != std::string::npos) break;
    }
    expected = seen.substr(0, cut);
    std::string all_stops;
    for (const auto& s : stops) all_stops += s + "|";
    StopMatcher m(stops);
    std::string emitted;
    for (const auto& p : pieces) {
      emitted += m.push(p);
      // Never emits anything that is not in the final answer.
      ASSERT_LE(emitted.size(), expected.size()) << text << " stops " << all_stops;
      ASSERT_EQ(expected.compare(0, emitted.size(), emitted), 0) << text << " stops " << all_stops;
    }
    emitted += m.flush();
    ASSERT_EQ(emitted, expected) << "text " << text << " stops " << all_stops;
    ASSERT_EQ(m.matched(), cut != std::string::npos) << text;
    matched += m.matched();
  }
  EXPECT_GT(matched, 500);  // both outcomes exercised
  EXPECT_LT(matched, 2900);
}

}  // namespace
}  // namespace troupe::model
