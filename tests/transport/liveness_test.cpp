// Liveness and Backoff with made-up times: no clock, no sleeping.
#include <gtest/gtest.h>

#include "transport/liveness.hpp"

namespace troupe::transport {
namespace {

using std::chrono::milliseconds;
const Clock::time_point t0{};  // an arbitrary origin

TEST(Liveness, PeerIsLostAfterLivenessSilentIntervals) {
  Liveness l({milliseconds(1000), 3}, t0);
  EXPECT_FALSE(l.lost(t0));
  EXPECT_EQ(l.missed(t0 + milliseconds(2999)), 2);
  EXPECT_FALSE(l.lost(t0 + milliseconds(2999)));
  EXPECT_TRUE(l.lost(t0 + milliseconds(3000)));
  EXPECT_EQ(l.deadline(), t0 + milliseconds(3000));
}

TEST(Liveness, AnyMessageCountsAsABeat) {
  Liveness l({milliseconds(100), 4}, t0);
  for (int i = 1; i <= 50; ++i) l.on_message(t0 + milliseconds(350 * i));  // gaps under 4 intervals
  const auto last = t0 + milliseconds(350 * 50);
  EXPECT_FALSE(l.lost(last + milliseconds(399)));
  EXPECT_TRUE(l.lost(last + milliseconds(400)));
  // A message stamped earlier (out of order) does not move the clock back.
  l.on_message(t0);
  EXPECT_EQ(l.last_seen(), last);
}

TEST(Liveness, HeartbeatIsDueOnlyAfterAnIntervalWithoutSending) {
  Liveness l({milliseconds(1000), 3}, t0);
  EXPECT_FALSE(l.due_heartbeat(t0 + milliseconds(999)));
  EXPECT_TRUE(l.due_heartbeat(t0 + milliseconds(1000)));
  l.on_sent(t0 + milliseconds(1000));  // the beat
  EXPECT_FALSE(l.due_heartbeat(t0 + milliseconds(1999)));
  l.on_sent(t0 + milliseconds(1500));  // data: also postpones the next beat
  EXPECT_FALSE(l.due_heartbeat(t0 + milliseconds(2499)));
  EXPECT_TRUE(l.due_heartbeat(t0 + milliseconds(2500)));
  // Receiving does not count as sending.
  l.on_message(t0 + milliseconds(2600));
  EXPECT_TRUE(l.due_heartbeat(t0 + milliseconds(2600)));
}

TEST(Liveness, RefusesLivenessOutsideThreeToFive) {
  EXPECT_THROW(Liveness({milliseconds(1000), 2}, t0), std::invalid_argument);
  EXPECT_THROW(Liveness({milliseconds(1000), 6}, t0), std::invalid_argument);
  EXPECT_THROW(Liveness({milliseconds(0), 3}, t0), std::invalid_argument);
  try {
    Liveness({milliseconds(1000), 9}, t0);
    FAIL() << "liveness 9 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "liveness: a peer is lost after 3 to 5 silent intervals, got 9");
  }
  EXPECT_NO_THROW(Liveness({milliseconds(1), 5}, t0));
}

TEST(Backoff, DoublesUpToTheMaximumAndResets) {
  Backoff b({milliseconds(1000), milliseconds(32000)});
  std::vector<int64_t> delays;
  for (int i = 0; i < 8; ++i) delays.push_back(b.next().count());
  EXPECT_EQ(delays, (std::vector<int64_t>{1000, 2000, 4000, 8000, 16000, 32000, 32000, 32000}));
  EXPECT_EQ(b.attempts(), 8);
  b.reset();
  EXPECT_EQ(b.attempts(), 0);
  EXPECT_EQ(b.next(), milliseconds(1000));
  Backoff odd({milliseconds(300), milliseconds(1000)});
  EXPECT_EQ(odd.next(), milliseconds(300));
  EXPECT_EQ(odd.next(), milliseconds(600));
  EXPECT_EQ(odd.next(), milliseconds(1000));
  EXPECT_THROW(Backoff({milliseconds(0), milliseconds(10)}), std::invalid_argument);
  EXPECT_THROW(Backoff({milliseconds(20), milliseconds(10)}), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::transport
