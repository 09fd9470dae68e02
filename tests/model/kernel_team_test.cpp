// KernelTeam (model/kernel_team.hpp): at::parallel_for's contract on threads
// kept between calls: every index once, its chunking, exceptions, nesting,
// one team per calling thread sized by that thread's budget, helpers that
// sleep and wake, a helper that finds itself on its caller's CPU, a fork()'s
// child; and KernelTeamScope, which only small
// passes open and which keeps libgomp out of them.
#include <omp.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "model/config.hpp"
#include "model/gpt2.hpp"
#include "model/kernel_team.hpp"
#include "model/linear.hpp"
#include "model/weights.hpp"

namespace troupe::model {
namespace {

using Chunks = std::vector<std::pair<int64_t, int64_t>>;

// The chunks f saw (sorted) and the threads that ran them.
struct Seen {
  std::mutex m;
  Chunks chunks;
  std::set<std::thread::id> threads;
  void add(int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(m);
    chunks.emplace_back(b, e);
    threads.insert(std::this_thread::get_id());
  }
  Chunks sorted() {
    std::sort(chunks.begin(), chunks.end());
    return chunks;
  }
};

// A small pass's scope: the calls in it run on this thread's team.
constexpr int64_t kSmall = 1;

Chunks chunks_of(bool team, int64_t begin, int64_t end, int64_t grain) {
  const KernelTeamScope scope(team ? kSmall : kTeamMaxTokens + 1);
  Seen seen;
  kernel_parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { seen.add(b, e); });
  return seen.sorted();
}

// Runs f(b, e), then waits until `n` chunks have arrived: a region of n such
// chunks can only finish with n threads running at once.
struct Together {
  int n;
  std::atomic<int> arrived{0};
  explicit Together(int threads) : n(threads) {}
  template <class F>
  void operator()(int64_t b, int64_t e, const F& f) {
    f(b, e);
    arrived.fetch_add(1);
    while (arrived.load() < n) std::this_thread::yield();
  }
};

// Restores this thread's team size (ATen's count) when a test changes it.
struct ThreadsGuard {
  int was = at::get_num_threads();
  ~ThreadsGuard() { at::set_num_threads(was); }
};

TEST(KernelTeam, SplitsAsAtParallelForDoes) {
  ThreadsGuard guard;
  for (int threads : {1, 2, 3, 4}) {
    at::set_num_threads(threads);
    for (auto [b, e, g] : {std::tuple<int64_t, int64_t, int64_t>{0, 1, 1},
                           {0, 2, 1},
                           {0, 7, 1},
                           {5, 17, 1},
                           {0, 100, 30},
                           {0, 100, 0},
                           {0, 3, 64},
                           {10, 11, 0},
                           {0, 1000, 7},
                           {3, 3, 1}}) {
      const Chunks team = chunks_of(true, b, e, g), omp = chunks_of(false, b, e, g);
      EXPECT_EQ(team, omp) << "threads " << threads << " [" << b << ", " << e << ") grain " << g;
      int64_t at = b;  // covers [b, e) once, in order
      for (auto [cb, ce] : team) {
        EXPECT_EQ(cb, at);
        EXPECT_LT(cb, ce);
        at = ce;
      }
      EXPECT_EQ(at, e);
      EXPECT_LE(static_cast<int>(team.size()), threads);
    }
  }
}

TEST(KernelTeam, RunsTheChunksOnTheTeamsThreadsAndKeepsThem) {
  ThreadsGuard guard;
  at::set_num_threads(3);
  const KernelTeamScope scope(kSmall);
  Seen first, second;
  Together t1(3), t2(3);
  kernel_parallel_for(
      0, 3, 1, [&](int64_t b, int64_t e) { t1(b, e, [&](int64_t b, int64_t e) { first.add(b, e); }); });
  EXPECT_EQ(kernel_team_size(), 3);
  kernel_parallel_for(
      0, 3, 1, [&](int64_t b, int64_t e) { t2(b, e, [&](int64_t b, int64_t e) { second.add(b, e); }); });
  EXPECT_EQ(first.threads.size(), 3u);
  EXPECT_EQ(first.threads, second.threads);  // the same helpers, not new ones
  EXPECT_TRUE(first.threads.count(std::this_thread::get_id()));
}

TEST(KernelTeam, RethrowsAChunksExceptionOnTheCallerAndStaysUsable) {
  ThreadsGuard guard;
  at::set_num_threads(2);
  const KernelTeamScope scope(kSmall);
  for (int64_t bad : {0, 1}) {  // the caller's chunk, then the helper's
    std::atomic<int> ran{0};
    EXPECT_THROW(kernel_parallel_for(0, 2, 1,
                                     [&](int64_t b, int64_t) {
                                       ran.fetch_add(1);
                                       if (b == bad) throw std::runtime_error("chunk failed");
                                     }),
                 std::runtime_error);
    EXPECT_EQ(ran.load(), 2);  // rethrown once every chunk returned
  }
  std::atomic<int64_t> sum{0};
  kernel_parallel_for(0, 100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(KernelTeam, NestedCallsRunInlineOnTheirThread) {
  ThreadsGuard guard;
  at::set_num_threads(2);
  std::atomic<int> nested_off_thread{0}, nested_chunks{0};
  {
    const KernelTeamScope scope(kSmall);
    kernel_parallel_for(0, 2, 1, [&](int64_t, int64_t) {
      const auto me = std::this_thread::get_id();
      kernel_parallel_for(0, 64, 1, [&](int64_t, int64_t) {
        nested_chunks.fetch_add(1);
        if (std::this_thread::get_id() != me) nested_off_thread.fetch_add(1);
      });
    });
  }
  EXPECT_EQ(nested_chunks.load(), 2);  // one inline chunk per outer chunk
  EXPECT_EQ(nested_off_thread.load(), 0);
  // A scope opened inside an OpenMP region changes nothing.
  std::atomic<int> used_team{0};
  at::parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    const KernelTeamScope scope(kSmall);
    if (scope.uses_team()) used_team.fetch_add(1);
  });
  EXPECT_EQ(used_team.load(), 0);
}

TEST(KernelTeam, EachCallingThreadHasATeamOfItsOwnBudget) {
  std::atomic<bool> ok{true};
  std::vector<std::thread> callers;
  for (int threads : {1, 2, 3, 2}) {
    callers.emplace_back([threads, &ok] {
      // This thread's count alone, as apply_thread_budget() sets it
      // (at::set_num_threads would also change the other callers': threading.hpp).
      (void)at::get_num_threads();
      omp_set_num_threads(threads);
      const KernelTeamScope scope(kSmall);
      for (int round = 0; round < 300; ++round) {
        std::vector<int> hits(257, 0);
        kernel_parallel_for(0, 257, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) ++hits[i];
        });
        if (std::count(hits.begin(), hits.end(), 1) != 257) ok = false;
      }
      if (kernel_team_size() != (threads > 1 ? threads : 0)) ok = false;
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_TRUE(ok.load());
}

TEST(KernelTeam, FollowsAChangeOfTheCallersThreadCount) {
  ThreadsGuard guard;
  for (int threads : {2, 4, 2}) {
    at::set_num_threads(threads);
    const KernelTeamScope scope(kSmall);
    Seen seen;
    Together together(threads);
    kernel_parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      together(b, e, [&](int64_t b, int64_t e) { seen.add(b, e); });
    });
    EXPECT_EQ(kernel_team_size(), threads);
    EXPECT_EQ(static_cast<int>(seen.threads.size()), threads);
  }
}

TEST(KernelTeam, SleepingHelpersWakeForTheNextCall) {
  ThreadsGuard guard;
  at::set_num_threads(2);
  const KernelTeamScope scope(kSmall);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // past the spin: the helper sleeps
    Seen seen;
    Together together(2);
    kernel_parallel_for(0, 2, 1, [&](int64_t b, int64_t e) {
      together(b, e, [&](int64_t b, int64_t e) { seen.add(b, e); });
    });
    EXPECT_EQ(seen.threads.size(), 2u);
  }
}

// A helper the scheduler leaves on its caller's CPU would take turns with it
// for the whole step; at the next region it moves to another CPU it may use,
// and may use all of them again afterwards.
TEST(KernelTeam, AHelperOnItsCallersCpuMovesToAnother) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "this process may use one CPU: there is nowhere to move";
  int a = 0;
  while (!CPU_ISSET(a, &all)) ++a;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(a, &one);
  cpu_set_t helper_mask;
  CPU_ZERO(&helper_mask);
  uint64_t before = 0, after = 0;
  std::thread([&] {  // a new caller: a new team, whose helper may use every CPU
    ThreadsGuard guard;
    at::set_num_threads(2);
    const KernelTeamScope scope(kSmall);
    // The helper pins itself to CPU a, then the caller goes there too.
    kernel_parallel_for(0, 2, 1, [&](int64_t b, int64_t) {
      if (b == 1) sched_setaffinity(0, sizeof one, &one);
    });
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    ASSERT_EQ(sched_getcpu(), a);
    before = kernel_team_moves();
    kernel_parallel_for(0, 2, 1, [&](int64_t b, int64_t) {
      if (b == 1) sched_getaffinity(0, sizeof helper_mask, &helper_mask);
    });
    after = kernel_team_moves();
    sched_setaffinity(0, sizeof all, &all);
  })
      .join();
  // A move is an affinity without CPU a that the kernel accepted, so it ran
  // the helper elsewhere at once (where it runs by the time its chunk starts
  // is the scheduler's to change again under load: not asked).
  EXPECT_GE(after, before + 1);
  EXPECT_TRUE(CPU_EQUAL(&helper_mask, &all)) << "the helper may use every CPU again";
}

// Where it moves: beside its caller's last-level cache when it may, never to
// the caller's own CPU.
TEST(KernelTeam, AHelperMovesWithinItsCallersLastLevelCache) {
  using detail::helper_move_targets;
  const std::vector<int> two_sockets{0, 1, 2, 3, 4, 5, 6, 7}, socket0{0, 1, 2, 3};
  EXPECT_EQ(helper_move_targets(1, two_sockets, socket0), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(helper_move_targets(5, two_sockets, {4, 5, 6, 7}), (std::vector<int>{4, 6, 7}));
  // The cache unknown, or none of its other CPUs allowed: any other allowed CPU.
  EXPECT_EQ(helper_move_targets(1, two_sockets, {}), (std::vector<int>{0, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(helper_move_targets(1, {1, 6}, socket0), (std::vector<int>{6}));
  EXPECT_TRUE(helper_move_targets(1, {1}, socket0).empty());
}

TEST(KernelTeam, AForkedChildMakesATeamOfItsOwn) {
  ThreadsGuard guard;
  at::set_num_threads(2);
  const KernelTeamScope scope(kSmall);
  kernel_parallel_for(0, 2, 1, [](int64_t, int64_t) {});  // the parent's team exists
  ASSERT_EQ(kernel_team_size(), 2);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The parent's helper is not here: a call must not wait for it.
    Together together(2);
    kernel_parallel_for(0, 2, 1, [&](int64_t b, int64_t e) { together(b, e, [](int64_t, int64_t) {}); });
    _exit(together.arrived.load() == 2 && kernel_team_size() == 2 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(KernelTeam, OnlyASmallPassesScopeUsesTheTeamAndKeepsLibgompOut) {
  ThreadsGuard guard;
  at::set_num_threads(2);
  auto regions_in_omp = [] {
    std::atomic<int> in_omp{0};
    kernel_parallel_for(0, 2, 1, [&](int64_t, int64_t) {
      if (omp_in_parallel()) in_omp.fetch_add(1);
    });
    return in_omp.load();
  };
  EXPECT_EQ(regions_in_omp(), 2);  // no scope: at::parallel_for
  {
    const KernelTeamScope large(kTeamMaxTokens + 1);
    EXPECT_FALSE(large.uses_team());
    EXPECT_EQ(regions_in_omp(), 2);
    EXPECT_EQ(kernel_threads(), 2);
  }
  {
    const KernelTeamScope small(kTeamMaxTokens);
    EXPECT_TRUE(small.uses_team());
    EXPECT_EQ(regions_in_omp(), 0);
    EXPECT_EQ(kernel_threads(), 2);
    EXPECT_EQ(at::get_num_threads(), 1);  // libtorch's own ops run on this thread alone
    std::atomic<int> torch_chunks{0};
    at::parallel_for(0, 1000, 1, [&](int64_t, int64_t) { torch_chunks.fetch_add(1); });
    EXPECT_EQ(torch_chunks.load(), 1);
    {
      const KernelTeamScope inner(kTeamMaxTokens + 1);  // nested: the outer one's choice holds
      EXPECT_FALSE(inner.uses_team());
      EXPECT_EQ(regions_in_omp(), 0);
    }
    EXPECT_EQ(regions_in_omp(), 0);
  }
  EXPECT_EQ(at::get_num_threads(), 2);  // restored
  EXPECT_EQ(regions_in_omp(), 2);
  set_kernel_team_enabled(false);
  {
    const KernelTeamScope off(kSmall);
    EXPECT_FALSE(off.uses_team());
    EXPECT_EQ(regions_in_omp(), 2);
  }
  set_kernel_team_enabled(true);
  EXPECT_TRUE(kernel_team_enabled());
}

TEST(KernelTeam, ManyRegionsWithGapsAroundTheSpin) {
  ThreadsGuard guard;
  at::set_num_threads(2);
  const KernelTeamScope scope(kSmall);
  std::vector<int> hits(64);
  for (int round = 0; round < 4000; ++round) {
    const auto gap = std::chrono::microseconds((round % 5) * 20);  // 0-80 us: some past the helpers' spin
    const auto until = std::chrono::steady_clock::now() + gap;
    while (std::chrono::steady_clock::now() < until) {
    }
    std::fill(hits.begin(), hits.end(), 0);
    kernel_parallel_for(0, 64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[i];
    });
    ASSERT_EQ(std::count(hits.begin(), hits.end(), 1), 64) << "round " << round;
  }
}

// A pass small enough for the team gives the same bits as on OpenMP regions,
// for every weight dtype (each output column is its panel's alone).
TEST(KernelTeam, ASmallPassComputesTheSameBitsAsOnOpenMpRegions) {
  ThreadsGuard guard;
  at::set_num_threads(2);
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  const Gpt2Weights weights = Gpt2Weights::random(cfg, 77);
  const std::vector<int32_t> ids{464, 2068, 7586, 21831, 18045};
  for (WeightDtype dtype : {WeightDtype::kFloat32, WeightDtype::kBFloat16, WeightDtype::kInt8}) {
    const Gpt2 model(cfg, weights, torch::kCPU, dtype);
    set_kernel_team_enabled(false);
    const torch::Tensor on_omp = model.forward_full(ids);
    set_kernel_team_enabled(true);
    const torch::Tensor on_team = model.forward_full(ids);
    EXPECT_EQ(kernel_team_size(), 2);  // the pass did run on a team
    EXPECT_TRUE(torch::equal(on_omp, on_team)) << to_string(dtype);
  }
}

}  // namespace
}  // namespace troupe::model
