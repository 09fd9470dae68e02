// The threading policy: CPU counting as containers limit it, thread budgets for
// several workers in one process, and what libgomp, ATen and OpenBLAS really
// do when two threads set their own thread counts (model/threading.hpp).
#include <dlfcn.h>
#include <omp.h>
#include <sched.h>
#include <sys/resource.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "model/cpu_count.hpp"
#include "model/kernel_team.hpp"
#include "model/threading.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// What `f` throws as std::invalid_argument, or "" when it does not throw.
std::string invalid_argument_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// ---- CPU counting ---------------------------------------------------------

TEST(CpuCount, ParsesCgroupV2CpuMax) {
  EXPECT_EQ(parse_cpu_max("max 100000\n"), std::nullopt);
  EXPECT_EQ(parse_cpu_max("150000 100000\n"), 1.5);
  EXPECT_EQ(parse_cpu_max("200000 100000"), 2.0);
  EXPECT_EQ(parse_cpu_max("5000 10000"), 0.5);
  for (const char* bad :
       {"", "max", "150000", "abc 100000", "150000 0", "-1 100000", "1 2 3", "1.5 100000"}) {
    const std::string e = invalid_argument_of([&] { parse_cpu_max(bad); });
    EXPECT_HAS(e, "cpu.max");
    EXPECT_HAS(e, std::string("\"") + bad + "\"");
  }
}

TEST(CpuCount, ParsesCgroupV1CfsQuota) {
  EXPECT_EQ(parse_cfs_quota("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(parse_cfs_quota("250000\n", "100000\n"), 2.5);
  EXPECT_EQ(parse_cfs_quota("50000", "100000"), 0.5);
  EXPECT_HAS(invalid_argument_of([] { parse_cfs_quota("x", "100000"); }), "cpu.cfs_quota_us");
  EXPECT_HAS(invalid_argument_of([] { parse_cfs_quota("0", "100000"); }), "cpu.cfs_quota_us");
  EXPECT_HAS(invalid_argument_of([] { parse_cfs_quota("-2", "100000"); }), "\"-2\"");
  EXPECT_HAS(invalid_argument_of([] { parse_cfs_quota("100000", "0"); }), "cpu.cfs_period_us");
  EXPECT_HAS(invalid_argument_of([] { parse_cfs_quota("100000", ""); }), "cpu.cfs_period_us");
}

TEST(CpuCount, QuotaRoundsUpToWholeCpus) {
  EXPECT_EQ(cpus_for_quota(0.1), 1);
  EXPECT_EQ(cpus_for_quota(1.0), 1);
  EXPECT_EQ(cpus_for_quota(1.01), 2);
  EXPECT_EQ(cpus_for_quota(2.0), 2);
  EXPECT_EQ(cpus_for_quota(2.5), 3);
}

void write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(CpuCount, CgroupV2TakesTheTightestQuotaOnThePath) {
  test::TempDir root;
  write(root.file("a/cpu.max"), "max 100000\n");
  write(root.file("a/b/cpu.max"), "300000 100000\n");
  CgroupQuota q = cgroup_cpu_quota(root.path(), "0::/a/b\n");
  EXPECT_EQ(q.cpus, 3.0);
  EXPECT_EQ(q.file, root.file("a/b/cpu.max"));
  // A parent's limit binds its children too (Kubernetes pod vs container).
  write(root.file("a/cpu.max"), "150000 100000\n");
  q = cgroup_cpu_quota(root.path(), "0::/a/b\n");
  EXPECT_EQ(q.cpus, 1.5);
  EXPECT_EQ(q.file, root.file("a/cpu.max"));
  // No limit anywhere.
  write(root.file("a/cpu.max"), "max 100000\n");
  write(root.file("a/b/cpu.max"), "max 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/a/b\n").cpus, 0.0);
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/a/b\n").file, "");
}

TEST(CpuCount, ParsesLinuxCpuLists) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(parse_cpu_list("3,1-2,2"), (std::vector<int>{1, 2, 3}));  // sorted, once each
  EXPECT_EQ(parse_cpu_list("\n"), std::vector<int>{});
  for (const char* bad : {"1-", "-2", "3-1", "a", "1,,2", "1,", "0-99999999"})
    EXPECT_THROW(parse_cpu_list(bad), std::invalid_argument) << bad;
}

// The last-level cache is the highest level among the data and unified
// caches, whatever the index order; unknown means empty.
TEST(CpuCount, LastLevelCacheCpusFromSysfs) {
  test::TempDir root;
  auto cache = [&](int cpu, int index, const std::string& level, const std::string& type,
                   const std::string& list) {
    const std::string dir = "cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(index) + "/";
    write(root.file(dir + "level"), level + "\n");
    write(root.file(dir + "type"), type + "\n");
    write(root.file(dir + "shared_cpu_list"), list + "\n");
  };
  cache(2, 0, "1", "Data", "2,34");
  cache(2, 1, "1", "Instruction", "2,34");
  cache(2, 2, "3", "Unified", "0-15,32-47");  // L3 listed before L2
  cache(2, 3, "2", "Unified", "2,34");
  EXPECT_EQ(last_level_cache_cpus(2, root.path()).size(), 32u);
  EXPECT_EQ(last_level_cache_cpus(2, root.path()).front(), 0);
  EXPECT_TRUE(last_level_cache_cpus(7, root.path()).empty());  // no files
  cache(3, 0, "3", "Unified", "0-x");
  EXPECT_TRUE(last_level_cache_cpus(3, root.path()).empty());  // malformed
}

TEST(CpuCount, CgroupV2InAContainerReadsTheMountsOwnFile) {
  test::TempDir root;
  write(root.file("cpu.max"), "200000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/\n").cpus, 2.0);
  // The host's path, not visible inside the container's mount.
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "0::/system.slice/docker-1234.scope\n").cpus, 2.0);
}

TEST(CpuCount, CgroupV1ReadsTheCpuController) {
  test::TempDir root;
  write(root.file("cpu,cpuacct/docker/x/cpu.cfs_quota_us"), "50000\n");
  write(root.file("cpu,cpuacct/docker/x/cpu.cfs_period_us"), "100000\n");
  write(root.file("memory/docker/x/memory.limit_in_bytes"), "1073741824\n");
  const std::string self = "12:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n1:name=systemd:/docker/x\n";
  CgroupQuota q = cgroup_cpu_quota(root.path(), self);
  EXPECT_EQ(q.cpus, 0.5);
  EXPECT_EQ(q.file, root.file("cpu,cpuacct/docker/x/cpu.cfs_quota_us"));
  write(root.file("cpu,cpuacct/docker/x/cpu.cfs_quota_us"), "-1\n");
  EXPECT_EQ(cgroup_cpu_quota(root.path(), self).cpus, 0.0);
  // Only memory limited: no CPU quota.
  EXPECT_EQ(cgroup_cpu_quota(root.path(), "12:memory:/docker/x\n").cpus, 0.0);
}

TEST(CpuCount, MalformedCgroupFileIsNamed) {
  test::TempDir root;
  write(root.file("a/cpu.max"), "lots 100000\n");
  const std::string e = invalid_argument_of([&] { cgroup_cpu_quota(root.path(), "0::/a\n"); });
  EXPECT_HAS(e, root.file("a/cpu.max"));
  EXPECT_HAS(e, "\"lots 100000\n\"");
}

int mask_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

TEST(CpuCount, FollowsTheAffinityMask) {
  EXPECT_EQ(affinity_cpus(), mask_count());
  const CpuCount all = count_cpus();
  EXPECT_EQ(all.affinity, mask_count());
  EXPECT_GE(all.usable, 1);
  EXPECT_LE(all.usable, all.affinity);
  if (all.quota > 0) {
    EXPECT_EQ(all.usable, std::min(all.affinity, cpus_for_quota(all.quota)));
  }
  // Pinned to one CPU (taskset -c N), the count follows; on its own thread,
  // so the rest of the process keeps its mask.
  std::thread([] {
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    int first = 0;
    while (!CPU_ISSET(first, &set)) ++first;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    ASSERT_EQ(sched_setaffinity(0, sizeof set, &set), 0);
    EXPECT_EQ(affinity_cpus(), 1);
    EXPECT_EQ(count_cpus().usable, 1);
  }).join();
  EXPECT_EQ(affinity_cpus(), mask_count());
}

TEST(CpuCount, PinsTheCallingThreadOnly) {
  const std::vector<int> all = affinity_cpu_list();
  ASSERT_FALSE(all.empty());
  std::thread([&] {
    ASSERT_TRUE(pin_calling_thread({all.front()}));
    EXPECT_EQ(affinity_cpu_list(), std::vector<int>{all.front()});
    // A CPU number past cpu_set_t's 1024 takes the sized set: the kernel
    // keeps the CPUs it has, and refuses a set of none.
    ASSERT_TRUE(pin_calling_thread({all.back(), CPU_SETSIZE + 5}));
    EXPECT_EQ(affinity_cpu_list(), std::vector<int>{all.back()});
    EXPECT_FALSE(pin_calling_thread({CPU_SETSIZE + 5}));
    EXPECT_FALSE(pin_calling_thread({}));
    EXPECT_FALSE(pin_calling_thread({-1, all.front()}));
    EXPECT_EQ(affinity_cpu_list(), std::vector<int>{all.back()});  // a refused call changes nothing
    ASSERT_TRUE(pin_calling_thread(all));
    EXPECT_EQ(affinity_cpu_list(), all);
  }).join();
  EXPECT_EQ(affinity_cpu_list(), all);
}

// ---- Budgets ----------------------------------------------------------------

TEST(ThreadBudget, SplitsCpusSoWorkersUseThemOnce) {
  auto one = split_thread_budget(8, 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].intra_op_threads, 8);
  EXPECT_EQ(one[0].blas_threads, 8);

  auto three = split_thread_budget(8, 3);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0].intra_op_threads, 3);
  EXPECT_EQ(three[1].intra_op_threads, 3);
  EXPECT_EQ(three[2].intra_op_threads, 2);
  for (const auto& b : three) EXPECT_EQ(b.blas_threads, 1);

  for (int cpus = 1; cpus <= 17; ++cpus) {
    for (int workers = 1; workers <= 9; ++workers) {
      int total = 0;
      for (const auto& b : split_thread_budget(cpus, workers)) {
        EXPECT_GE(b.intra_op_threads, 1);
        total += b.intra_op_threads;
      }
      EXPECT_EQ(total, std::max(cpus, workers)) << cpus << " CPUs, " << workers << " workers";
    }
  }
}

// --threads-per-worker: one worker of 1 thread on 2 CPUs ran BLAS with 2
// (found by the simulator's fidelity run: prompt steps 1.3x slower served
// than profiled with --threads 1).
TEST(ThreadBudget, ThreadsPerWorkerBoundBlasToo) {
  auto one = split_thread_budget(2, 1, 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].intra_op_threads, 1);
  EXPECT_EQ(one[0].blas_threads, 1);
  auto wide = split_thread_budget(2, 1, 4);  // asked for more than the CPUs: given
  EXPECT_EQ(wide[0].intra_op_threads, 4);
  EXPECT_EQ(wide[0].blas_threads, 4);
  for (const auto& b : split_thread_budget(8, 3, 2)) {
    EXPECT_EQ(b.intra_op_threads, 2);
    EXPECT_EQ(b.blas_threads, 1);
  }
  EXPECT_HAS(invalid_argument_of([] { split_thread_budget(2, 1, -1); }), "got -1");
}

TEST(ThreadBudget, RefusesNoCpusOrNoWorkers) {
  EXPECT_HAS(invalid_argument_of([] { split_thread_budget(0, 1); }), "0 CPUs");
  EXPECT_HAS(invalid_argument_of([] { split_thread_budget(2, 0); }), "0 workers");
  EXPECT_HAS(invalid_argument_of([] { apply_thread_budget({0, 1}); }), "intra_op 0");
  EXPECT_HAS(invalid_argument_of([] { apply_thread_budget({1, -1}); }), "blas -1");
}

// A thread that runs the calls given to it one at a time: lets a test
// interleave two workers' calls in a fixed order.
class Lane {
 public:
  Lane() : thread_([this] { loop(); }) {}
  ~Lane() {
    post(nullptr);
    thread_.join();
  }
  template <class F>
  auto run(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    post([&task] { task(); });
    return result.get();
  }

 private:
  void post(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push(std::move(f));
    cv_.notify_one();
  }
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        f = std::move(queue_.front());
        queue_.pop();
      }
      if (!f) return;
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::queue<std::function<void()>> queue_;
  std::thread thread_;
};

// The team size a plain OpenMP parallel region gets on the calling thread.
int omp_team() {
  std::atomic<int> size{0};
#pragma omp parallel
  {
    if (omp_get_thread_num() == 0) size = omp_get_num_threads();
  }
  return size;
}

// The team size at::parallel_for gets on the calling thread (1 when it runs inline).
int aten_team() {
  std::atomic<int> size{1};
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
    if (omp_in_parallel()) size = omp_get_num_threads();
  });
  return size;
}

// Restores ATen's process-wide default and this thread's team size.
struct SavedAtenThreads {
  int saved = at::get_num_threads();
  ~SavedAtenThreads() { at::set_num_threads(saved); }
};

TEST(ThreadBudget, LibgompTeamSizeIsPerThread) {
  Lane a, b;
  a.run([] { omp_set_num_threads(1); });
  b.run([] { omp_set_num_threads(3); });
  EXPECT_EQ(a.run(omp_team), 1);
  EXPECT_EQ(b.run(omp_team), 3);
  EXPECT_EQ(a.run(omp_team), 1) << "a's team size must not follow b's";
}

// Why apply_thread_budget does not call at::set_num_threads: ATen keeps a
// process-wide count and copies it into a thread on that thread's first
// at::parallel_for, so a worker that set its own count first gets whatever
// another worker set last. If this starts failing, ATen changed: re-check
// apply_thread_budget and docs/threading.md.
TEST(ThreadBudget, AtenSetNumThreadsIsOverriddenByAnotherThreadsCall) {
  SavedAtenThreads restore;
  Lane a, b;
  a.run([] { at::set_num_threads(1); });
  b.run([] { at::set_num_threads(3); });
  EXPECT_EQ(a.run(aten_team), 3) << "a's first parallel_for took b's count";
}

TEST(ThreadBudget, AppliedBudgetsHoldPerWorkerThread) {
  SavedAtenThreads restore;
  at::set_num_threads(2);  // the process-wide default, as configure_threads sets it
  Lane a, b;
  a.run([] { apply_thread_budget({1, 1}); });
  b.run([] { apply_thread_budget({3, 1}); });
  at::set_num_threads(2);  // someone else sets the default again
  EXPECT_EQ(a.run(aten_team), 1);
  EXPECT_EQ(b.run(aten_team), 3);
  EXPECT_EQ(a.run([] { return at::get_num_threads(); }), 1);
  EXPECT_EQ(a.run(omp_team), 1);
  // A thread that never applied a budget gets the process-wide default.
  Lane c;
  EXPECT_EQ(c.run(aten_team), 2);
}

TEST(ThreadBudget, BlasCountIsProcessWide) {
  using Get = int (*)();
  using Set = void (*)(int);
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!get || !set) GTEST_SKIP() << "the BLAS behind libblas.so.3 is not OpenBLAS: no thread count to check";
  const int saved = get();
  SavedAtenThreads restore;
  {
    Lane a;
    a.run([] { apply_thread_budget({2, 2}); });
    EXPECT_EQ(get(), 2) << "set on one thread, seen on another";
    a.run([] { apply_thread_budget({1, 1}); });
    EXPECT_EQ(get(), 1);
  }
  set(saved);
}

// The test binaries share the shipped binary's main-time policy
// (tests/test_main.cpp): libgomp loaded with a wait policy, one team per CPU.
TEST(ThreadBudget, TestsRunUnderTheShippedPolicy) {
  ASSERT_NE(std::getenv("OMP_WAIT_POLICY"), nullptr) << "test_main.cpp must re-exec with OMP_WAIT_POLICY set";
  EXPECT_HAS(thread_summary(), std::string("omp_wait_policy=") + std::getenv("OMP_WAIT_POLICY"));
  ASSERT_NE(std::getenv("GOMP_SPINCOUNT"), nullptr) << "test_main.cpp or ctest must set GOMP_SPINCOUNT";
  EXPECT_STREQ(std::getenv("GOMP_SPINCOUNT"), kGompSpinCount);
  EXPECT_HAS(thread_summary(), "cpus=" + std::to_string(usable_cpus()));
  // Which pool runs a small pass's kernels (kernel_team.hpp) is named too.
  set_kernel_team_enabled(false);
  EXPECT_HAS(thread_summary(), "kernel_teams=off");
  set_kernel_team_enabled(true);
  EXPECT_HAS(thread_summary(), "kernel_teams=" + std::to_string(kTeamMaxTokens));
}

// What tune_malloc is for: a step's activations, freed at its end, serve the
// next step without page faults. Sixteen 4 MiB tensors live at once (more
// than twice the largest, so glibc's default trims the heap top when they are
// freed and faults all 64 MiB in again next time: ~16k faults, ~32 with
// transparent huge pages); tuned, the third round faults nothing.
TEST(Malloc, FreedActivationsServeTheNextStepWithoutPageFaults) {
  if (!test::kGlibcHeap) GTEST_SKIP() << "AddressSanitizer replaces malloc: tune_malloc has nothing to tune";
  if (const char* v = std::getenv("TROUPE_MALLOC"); v && std::string(v) == "default")
    GTEST_SKIP() << "TROUPE_MALLOC=default: glibc's defaults on purpose";
  EXPECT_HAS(thread_summary(), "malloc=tuned");
  auto step = [] {
    constexpr size_t kBytes = size_t{4} << 20;
    std::vector<char*> live;
    for (int i = 0; i < 16; ++i) {
      live.push_back(static_cast<char*>(std::malloc(kBytes)));
      std::memset(live.back(), i, kBytes);
    }
    for (char* p : live) std::free(p);
  };
  auto faults = [] {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_minflt + u.ru_majflt;
  };
  step();
  step();
  const long before = faults();
  step();
  EXPECT_LT(faults() - before, 16);
}

}  // namespace
}  // namespace troupe::model
