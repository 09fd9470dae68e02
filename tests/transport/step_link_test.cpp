// A worker's step stream made whole after lost frames: InOrder hands items on
// once each in order (duplicates dropped, early ones kept), Unacked keeps
// sent frames until the peer has them and sends the missing ones again.
#include "transport/step_link.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace troupe::transport {
namespace {

using std::chrono::milliseconds;

TEST(InOrder, HandsOnEachOnceInOrder) {
  InOrder<std::string> in;
  EXPECT_EQ(in.arrive(1, "a"), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(in.arrive(1, "a again").empty()) << "a duplicate";
  EXPECT_TRUE(in.arrive(3, "c").empty()) << "past a gap: kept";
  EXPECT_TRUE(in.arrive(4, "d").empty());
  EXPECT_TRUE(in.arrive(3, "c again").empty()) << "kept already";
  EXPECT_EQ(in.delivered(), 1u);
  EXPECT_EQ(in.early(), 2u);
  EXPECT_EQ(in.arrive(2, "b"), (std::vector<std::string>{"b", "c", "d"})) << "the gap filled";
  EXPECT_EQ(in.delivered(), 4u);
  EXPECT_EQ(in.early(), 0u);
  EXPECT_TRUE(in.arrive(2, "b again").empty());
}

TEST(InOrder, KeepsAtMostMaxEarly) {
  InOrder<int> in(/*first=*/2, /*max_early=*/2);
  EXPECT_TRUE(in.arrive(3, 3).empty());
  EXPECT_TRUE(in.arrive(4, 4).empty());
  EXPECT_TRUE(in.arrive(5, 5).empty()) << "dropped: the sender sends it again";
  EXPECT_EQ(in.arrive(2, 2), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(in.arrive(5, 5), (std::vector<int>{5}));
}

TEST(Unacked, ResendsOnlyWhatThePeerLacksAfterTheGrace) {
  Unacked u;
  const auto t0 = Clock::now();
  u.sent(1, "p1", t0);
  u.sent(2, "p2", t0);
  u.sent(3, "p3", t0 + milliseconds(900));
  EXPECT_EQ(u.last_sent(), 3u);
  // The peer has 1; 2 left a second ago, 3 only just: 2 alone goes again.
  EXPECT_EQ(u.resend(1, t0 + milliseconds(1000), milliseconds(250)), (std::vector<std::string>{"p2"}));
  EXPECT_EQ(u.size(), 2u);
  // Not again within the grace; then both.
  EXPECT_TRUE(u.resend(1, t0 + milliseconds(1100), milliseconds(250)).empty());
  EXPECT_EQ(u.resend(1, t0 + milliseconds(1300), milliseconds(250)), (std::vector<std::string>{"p2", "p3"}));
  u.acked(3);
  EXPECT_EQ(u.size(), 0u);
  EXPECT_TRUE(u.resend(3, t0 + milliseconds(5000), milliseconds(250)).empty());
}

// Both directions over a link that loses frames: every plan runs once, in
// order, and every result reaches the head once, in order, whatever is lost
// (here: each frame whose number is a multiple of 3, the first time it goes).
TEST(StepLink, ALossyLinkLosesAndRepeatsNothing) {
  Unacked plans_sent, results_sent;
  InOrder<int> node_plans, head_results;
  std::vector<int> ran, taken;
  std::vector<uint64_t> lost_once;
  auto lossy = [&](uint64_t seq) {  // true: this copy is lost
    if (seq % 3 != 0) return false;
    for (uint64_t s : lost_once)
      if (s == seq) return false;
    lost_once.push_back(seq);
    return true;
  };
  auto t = Clock::now();
  const auto grace = milliseconds(100);
  auto node_gets_plan = [&](uint64_t seq) {
    for (int p : node_plans.arrive(seq, static_cast<int>(seq))) {
      ran.push_back(p);
      results_sent.sent(static_cast<uint64_t>(p), std::to_string(p), t);
      if (!lossy(1000 + static_cast<uint64_t>(p)))
        for (int r : head_results.arrive(static_cast<uint64_t>(p), p)) taken.push_back(r);
    }
  };
  for (uint64_t seq = 1; seq <= 30; ++seq) {
    plans_sent.sent(seq, std::to_string(seq), t);
    if (!lossy(seq)) node_gets_plan(seq);
  }
  // Heartbeats, a second apart: each side says what it has, the other resends.
  for (int beat = 0; beat < 10 && taken.size() < 30; ++beat) {
    t += milliseconds(1000);
    for (const std::string& body : plans_sent.resend(node_plans.delivered(), t, grace))
      node_gets_plan(std::stoull(body));
    for (const std::string& body : results_sent.resend(head_results.delivered(), t, grace))
      for (int r : head_results.arrive(std::stoull(body), std::stoi(body))) taken.push_back(r);
  }
  std::vector<int> want;
  for (int i = 1; i <= 30; ++i) want.push_back(i);
  EXPECT_EQ(ran, want);
  EXPECT_EQ(taken, want);
}

}  // namespace
}  // namespace troupe::transport
