// SocketBacklog driven directly: a fake sender stands for the ROUTER.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "transport/socket_backlog.hpp"

namespace troupe::transport {
namespace {

using Sent = SocketBacklog::Sent;
using Pushed = SocketBacklog::Pushed;

// Takes up to `room[peer]` frames per peer, then would block; `gone` peers answer kGone.
struct FakeSocket {
  std::map<std::string, int> room;
  std::set<std::string> gone;
  std::vector<std::pair<std::string, std::string>> taken;
  SocketBacklog::Sender sender() {
    return [this](const std::string& peer, std::string& body) {
      if (gone.count(peer)) return Sent::kGone;
      if (room[peer] == 0) return Sent::kWouldBlock;
      --room[peer];
      taken.emplace_back(peer, std::move(body));
      return Sent::kSent;
    };
  }
};

TEST(SocketBacklog, KeepsEachPeersOrderAndSendsWhatFits) {
  SocketBacklog b;
  EXPECT_FALSE(b.holds("a"));
  for (const char* f : {"a1", "a2", "a3"}) EXPECT_EQ(b.push("a", f), Pushed::kQueued);
  EXPECT_EQ(b.push("b", "b1"), Pushed::kQueued);
  EXPECT_TRUE(b.holds("a"));
  EXPECT_EQ(b.frames(), 4u);
  EXPECT_EQ(b.bytes(), 8u);
  FakeSocket s;
  s.room = {{"a", 2}, {"b", 0}};
  auto r = b.retry(s.sender());
  EXPECT_TRUE(r.gone.empty());
  EXPECT_TRUE(r.whole.empty());
  using Taken = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(s.taken, (Taken{{"a", "a1"}, {"a", "a2"}}));
  EXPECT_EQ(b.frames(), 2u);
  EXPECT_EQ(b.push("a", "a4"), Pushed::kQueued) << "behind what waits";
  s.room = {{"a", 10}, {"b", 10}};
  b.retry(s.sender());
  ASSERT_EQ(s.taken.size(), 5u);
  Taken of_a;  // peers go in no set order; each peer's frames in theirs
  for (const auto& t : s.taken)
    if (t.first == "a") of_a.push_back(t);
  EXPECT_EQ(of_a, (Taken{{"a", "a1"}, {"a", "a2"}, {"a", "a3"}, {"a", "a4"}}));
  EXPECT_FALSE(b.holds("a")) << "an empty backlog is no backlog";
  EXPECT_FALSE(b.holds("b"));
  EXPECT_EQ(b.frames(), 0u);
  EXPECT_EQ(b.bytes(), 0u);
  EXPECT_EQ(b.peers_cut(), 0u);
}

TEST(SocketBacklog, PastTheFrameBoundAPeerIsCutGetsItsFarewellThenIsWhole) {
  SocketBacklog b(BacklogLimits{3, 0});
  for (const char* f : {"1", "2", "3"}) EXPECT_EQ(b.push("a", f), Pushed::kQueued);
  EXPECT_EQ(b.push("a", "4"), Pushed::kCut);
  b.add_farewell("a", "bye");
  EXPECT_EQ(b.push("a", "5"), Pushed::kDropped);
  EXPECT_EQ(b.push("b", "x"), Pushed::kQueued) << "another peer is not touched";
  EXPECT_EQ(b.peers_cut(), 1u);
  EXPECT_EQ(b.cut_frames(), 2u);
  EXPECT_EQ(b.frames(), 5u) << "3 kept, the farewell past the bound, b's one";
  FakeSocket s;
  s.room = {{"a", 3}, {"b", 1}};
  auto r = b.retry(s.sender());
  EXPECT_TRUE(r.whole.empty()) << "the farewell still waits";
  EXPECT_EQ(b.push("a", "6"), Pushed::kDropped);
  s.room["a"] = 1;
  r = b.retry(s.sender());
  EXPECT_EQ(r.whole, std::vector<std::string>{"a"});
  EXPECT_EQ(s.taken.back(), (std::pair<std::string, std::string>{"a", "bye"}));
  EXPECT_FALSE(b.holds("a"));
  EXPECT_EQ(b.push("a", "7"), Pushed::kQueued) << "an ordinary peer again";
  EXPECT_EQ(b.cut_frames(), 3u);
}

TEST(SocketBacklog, ByteBoundCutsToo) {
  SocketBacklog b(BacklogLimits{0, 10});
  EXPECT_EQ(b.push("a", std::string(6, 'x')), Pushed::kQueued);
  EXPECT_EQ(b.push("a", std::string(4, 'x')), Pushed::kQueued) << "exactly at the bound";
  EXPECT_EQ(b.push("a", "x"), Pushed::kCut);
  EXPECT_EQ(b.bytes(), 10u);
}

// Cut at its first frame (one frame over the byte bound) and no farewell:
// nothing waits, so the next retry makes it whole.
TEST(SocketBacklog, CutWithNothingWaitingIsWholeAtTheNextRetry) {
  SocketBacklog b(BacklogLimits{0, 4});
  EXPECT_EQ(b.push("a", "too big"), Pushed::kCut);
  EXPECT_TRUE(b.holds("a"));
  EXPECT_EQ(b.push("a", "x"), Pushed::kDropped);
  FakeSocket s;
  EXPECT_EQ(b.retry(s.sender()).whole, std::vector<std::string>{"a"});
  EXPECT_FALSE(b.holds("a"));
  EXPECT_TRUE(s.taken.empty());
}

TEST(SocketBacklog, GonePeerLosesItsWholeBacklog) {
  SocketBacklog b;
  for (const char* f : {"1", "22", "333"}) b.push("a", f);
  b.push("b", "x");
  FakeSocket s;
  s.gone = {"a"};
  auto r = b.retry(s.sender());
  using Gone = std::vector<std::pair<std::string, size_t>>;
  EXPECT_EQ(r.gone, (Gone{{"a", 3}}));
  EXPECT_FALSE(b.holds("a"));
  EXPECT_EQ(b.frames(), 1u);
  EXPECT_EQ(b.bytes(), 1u);
}

TEST(SocketBacklog, AFrameThatWouldBlockStaysWhole) {
  SocketBacklog b;
  b.push("a", "keep me");
  FakeSocket s;
  b.retry(s.sender());
  s.room["a"] = 1;
  b.retry(s.sender());
  ASSERT_EQ(s.taken.size(), 1u);
  EXPECT_EQ(s.taken[0].second, "keep me");
}

}  // namespace
}  // namespace troupe::transport
