#include "core/failpoints.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe::fail {
namespace {

// Every test starts and ends with nothing configured: the state is global.
class Failpoints : public ::testing::Test {
 protected:
  void SetUp() override { configure(""); }
  void TearDown() override { configure(""); }
};

// configure(spec)'s refusal, or "" when it accepts the spec.
std::string refusal(const std::string& spec) {
  try {
    configure(spec);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// The action of each of the next `count` hits of `name` (their log lines
// swallowed).
std::vector<Action> actions(std::string_view name, int count) {
  std::vector<Action> out;
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < count; ++i) out.push_back(hit(name).action);
  ::testing::internal::GetCapturedStderr();
  return out;
}

void wait_for_hits(std::string_view name, uint64_t n) {
  while (hits(name) < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

constexpr Action N = Action::kNone;
constexpr Action D = Action::kDrop;

TEST_F(Failpoints, GrammarAcceptsTheDocumentedForms) {
  for (const std::string spec :
       {"worker.step=hang@3;worker.step=sleep(2000)@5%;node.send_result=drop@2;head.recv=delay(500)",
        "  a.b = sleep( 20 ) @ 3 - 5 ;; c_d=drop @ 2 + ; ", "x=off", "x=error", "x=error(disk full: /tmp)",
        "x=crash@7", "x=drop@0.5%", "x=drop@100%", "x=sleep(0)", "x=delay(86400000)@1-1"}) {
    EXPECT_EQ(refusal(spec), "") << spec;
    EXPECT_TRUE(enabled()) << spec;
  }
}

TEST_F(Failpoints, GrammarRefusalsNameTheEntryAndWhatIsExpected) {
  struct Case {
    std::string spec, entry, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"worker.step", "worker.step", "name=action"},
           {"a=drop; Worker.step=drop", "Worker.step=drop", "name=action"},
           {"=drop", "=drop", "name=action"},
           {"x=explode", "x=explode", "an action: off, drop"},
           {"x=", "x=", "an action"},
           {"x=sleep", "x=sleep", "sleep(ms)"},
           {"x=delay(abc)", "x=delay(abc)", "delay(ms)"},
           {"x=sleep(10", "x=sleep(10", "sleep(ms)"},
           {"x=sleep(86400001)", "x=sleep(86400001)", "0..86400000"},
           {"x=spin", "x=spin", "spin(us)"},
           {"x=spin(1000001)", "x=spin(1000001)", "0..1000000"},
           {"x=error(a;b)", "x=error(a", "')' closing error(text)"},
           {"x=drop@", "x=drop@", "N, N+, N-M or P%"},
           {"x=drop@0", "x=drop@0", ">= 1"},
           {"x=drop@5-3", "x=drop@5-3", "N <= M"},
           {"x=drop@0%", "x=drop@0%", "0 < P <= 100"},
           {"x=drop@100.5%", "x=drop@100.5%", "0 < P <= 100"},
           {"x=drop@1.5", "x=drop@1.5", "needs '%'"},
           {"x=drop@3x", "x=drop@3x", "got 'x'"},
           {"x=drop hang", "x=drop hang", "got 'hang'"},
       }) {
    const std::string message = refusal(c.spec);
    EXPECT_NE(message.find("failpoint entry '" + c.entry + "'"), std::string::npos)
        << c.spec << ": " << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.spec << ": " << message;
  }
}

TEST_F(Failpoints, RefusedSpecKeepsThePreviousConfiguration) {
  configure("t.k=drop");
  EXPECT_THROW(configure("t.k=error;t.k=bogus"), std::invalid_argument);
  EXPECT_EQ(hit("t.k").action, Action::kDrop);
}

TEST_F(Failpoints, EmptySpecTurnsEverythingOff) {
  configure("t.a=drop");
  ASSERT_TRUE(enabled());
  configure(" ; ;");
  EXPECT_FALSE(enabled());
  EXPECT_EQ(hit("t.a").action, Action::kNone);
  EXPECT_EQ(hits("t.a"), 0u);
}

TEST_F(Failpoints, DisabledMacroNeitherEvaluatesTheNameNorHits) {
  int evaluated = 0;
  EXPECT_FALSE(enabled());
  EXPECT_EQ(TROUPE_FAILPOINT((++evaluated, "t.m")).action, Action::kNone);
  EXPECT_EQ(evaluated, 0);

  configure("t.m=drop");
  EXPECT_EQ(TROUPE_FAILPOINT((++evaluated, "t.m")).action, Action::kDrop);
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(hits("t.m"), 1u);
}

TEST_F(Failpoints, TriggerNthFiresOnThatHitOnly) {
  configure("t.n=drop@3");
  EXPECT_EQ(actions("t.n", 5), (std::vector<Action>{N, N, D, N, N}));
  EXPECT_EQ(hits("t.n"), 5u);
}

TEST_F(Failpoints, TriggerFromFiresFromThatHitOn) {
  configure("t.n=drop@3+");
  EXPECT_EQ(actions("t.n", 5), (std::vector<Action>{N, N, D, D, D}));
}

TEST_F(Failpoints, TriggerRangeFiresInsideIt) {
  configure("t.n=drop@2-4");
  EXPECT_EQ(actions("t.n", 5), (std::vector<Action>{N, D, D, D, N}));
}

TEST_F(Failpoints, NoTriggerFiresEveryHit) {
  configure("t.n=drop");
  EXPECT_EQ(actions("t.n", 3), (std::vector<Action>{D, D, D}));
}

TEST_F(Failpoints, ConfigureRestartsTheHitCount) {
  configure("t.n=drop@2");
  EXPECT_EQ(actions("t.n", 2), (std::vector<Action>{N, D}));
  configure("t.n=drop@2");
  EXPECT_EQ(hits("t.n"), 0u);
  EXPECT_EQ(actions("t.n", 2), (std::vector<Action>{N, D}));
}

TEST_F(Failpoints, PercentFiresOnRoughlyThatShareOfHits) {
  configure("t.p=drop@25%", 7);
  const std::vector<Action> got = actions("t.p", 10000);
  const auto fired = std::count(got.begin(), got.end(), Action::kDrop);
  EXPECT_GT(fired, 2000);  // 25% of 10000 is 2500, sd 43
  EXPECT_LT(fired, 3000);
}

TEST_F(Failpoints, PercentHundredAlwaysFires) {
  configure("t.p=drop@100%", 3);
  const std::vector<Action> got = actions("t.p", 1000);
  EXPECT_EQ(got, std::vector<Action>(1000, D));
}

TEST_F(Failpoints, PercentReplaysForTheSameSeed) {
  configure("t.p=drop@50%", 7);
  const std::vector<Action> first = actions("t.p", 200);
  configure("t.p=drop@50%", 7);
  EXPECT_EQ(actions("t.p", 200), first);
  configure("t.p=drop@50%", 8);
  EXPECT_NE(actions("t.p", 200), first);
  configure("t.q=drop@50%", 7);
  EXPECT_NE(actions("t.q", 200), first);  // the name is part of the stream's seed
}

TEST_F(Failpoints, EntriesOfOneNameAreTriedInOrderAndShareTheCount) {
  configure("t.m=error(first)@2; t.m=drop@1-3; t.m=off@4; t.m=error");
  EXPECT_EQ(hit("t.m").action, Action::kDrop);
  const Outcome second = hit("t.m");
  EXPECT_EQ(second.action, Action::kError);
  EXPECT_EQ(second.error, "first");
  EXPECT_EQ(hit("t.m").action, Action::kDrop);
  EXPECT_EQ(hit("t.m").action, Action::kNone);  // off acts: later entries are not tried
  const Outcome fifth = hit("t.m");
  EXPECT_EQ(fifth.action, Action::kError);
  EXPECT_NE(fifth.error.find("t.m"), std::string::npos) << fifth.error;
  EXPECT_EQ(hits("t.m"), 5u);
}

TEST_F(Failpoints, ErrorHandsItsTextToTheCaller) {
  configure("t.e=error( disk full: /tmp )");
  const Outcome o = hit("t.e");
  EXPECT_EQ(o.action, Action::kError);
  EXPECT_EQ(o.error, "disk full: /tmp");
}

TEST_F(Failpoints, EachFiringPrintsOneLine) {
  configure("t.d=drop@2; t.s=sleep( 1 ); t.o=off");
  ::testing::internal::CaptureStderr();
  hit("t.d");
  hit("t.d");
  hit("t.s");
  hit("t.o");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "troupe: failpoint t.d fired: drop (hit 2)\n"
            "troupe: failpoint t.s fired: sleep(1) (hit 1)\n");
}

TEST_F(Failpoints, SleepAndDelayBlockAtLeastTheirTime) {
  configure("t.s=sleep(50); t.d=delay(50)");
  for (const char* name : {"t.s", "t.d"}) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(hit(name).action, Action::kNone);
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50)) << name;
  }
}

// A spin is CPU time of the calling thread (a process's CPU counts it, as a
// head's cost does), printed at hits 1, 2, 4, 8, ... only.
TEST_F(Failpoints, SpinBurnsTheCallersCpuAndPrintsSparingly) {
  configure("t.p=spin(20000)@2+");
  ::testing::internal::CaptureStderr();
  const auto cpu = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1'000'000'000LL + t.tv_nsec;
  };
  const int64_t c0 = cpu();
  EXPECT_EQ(hit("t.p").action, Action::kNone);  // hit 1: not triggered
  EXPECT_LT(cpu() - c0, 20'000'000);
  for (int i = 0; i < 4; ++i) hit("t.p");  // hits 2..5: 4 spins of 20 ms
  EXPECT_GE(cpu() - c0, 80'000'000);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "troupe: failpoint t.p fired: spin(20000) (hit 2)\n"
            "troupe: failpoint t.p fired: spin(20000) (hit 4)\n");
}

TEST_F(Failpoints, HangBlocksUntilReleasedAndNotOtherFailpoints) {
  configure("t.h=hang; t.d=drop");
  std::atomic<int> returned{0};
  std::vector<std::thread> hung;
  for (int i = 0; i < 2; ++i)
    hung.emplace_back([&] {
      hit("t.h");
      ++returned;
    });
  wait_for_hits("t.h", 2);
  EXPECT_EQ(hit("t.d").action, Action::kDrop);
  EXPECT_EQ(returned, 0);
  release_hangs();
  for (std::thread& t : hung) t.join();
  EXPECT_EQ(returned, 2);
  EXPECT_EQ(hit("t.h").action, Action::kNone);  // after release_hangs(): returns at once
  EXPECT_EQ(hits("t.h"), 3u);
}

TEST_F(Failpoints, ConfigureRearmsHang) {
  configure("t.h=hang");
  release_hangs();
  hit("t.h");
  configure("t.h=hang");
  std::atomic<bool> returned{false};
  std::thread hung([&] {
    hit("t.h");
    returned = true;
  });
  wait_for_hits("t.h", 1);
  EXPECT_FALSE(returned);
  release_hangs();
  hung.join();
  EXPECT_TRUE(returned);
}

using FailpointsDeathTest = Failpoints;

TEST_F(FailpointsDeathTest, CrashEndsTheProcessWithStatus134AndOneLine) {
  EXPECT_EXIT(
      {
        configure("t.c=crash@2");
        hit("t.c");
        hit("t.c");
        std::exit(0);
      },
      ::testing::ExitedWithCode(134), "troupe: failpoint t.c fired: crash \\(hit 2\\)");
}

TEST_F(Failpoints, ConfigureFromEnvReadsSpecAndSeed) {
  configure("t.p=drop@50%", 11);
  const std::vector<Action> seeded = actions("t.p", 100);

  setenv("TROUPE_FAILPOINTS", "t.p=drop@50%", 1);
  setenv("TROUPE_FAILPOINTS_SEED", "11", 1);
  ::testing::internal::CaptureStderr();
  configure_from_env();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "troupe: failpoints active: t.p=drop@50% (seed 11)\n");
  EXPECT_EQ(actions("t.p", 100), seeded);

  setenv("TROUPE_FAILPOINTS_SEED", "eleven", 1);
  EXPECT_THROW(configure_from_env(), std::invalid_argument);
  setenv("TROUPE_FAILPOINTS_SEED", "11", 1);
  setenv("TROUPE_FAILPOINTS", "t.p=maybe", 1);
  EXPECT_THROW(configure_from_env(), std::invalid_argument);

  unsetenv("TROUPE_FAILPOINTS");
  unsetenv("TROUPE_FAILPOINTS_SEED");
  ::testing::internal::CaptureStderr();
  configure_from_env();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_FALSE(enabled());
}

}  // namespace
}  // namespace troupe::fail
