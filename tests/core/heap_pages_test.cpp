#include "core/heap_pages.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_utils.hpp"

namespace troupe::core {
namespace {

// Freed heap memory between live allocations stays resident (free() trims
// only the heap's top) until release_free_heap hands its pages back.
TEST(HeapPages, ReleaseHandsFreedMemoryBack) {
  if (!test::kGlibcHeap) GTEST_SKIP() << "AddressSanitizer's malloc: nothing for malloc_trim to give back";
  constexpr size_t kPiece = 32 << 10;  // under glibc's mmap threshold: heap memory
  std::vector<void*> pieces, kept;
  for (int i = 0; i < 2048; ++i) {  // 64 MiB
    void* p = std::malloc(kPiece);
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, kPiece);
    (i % 16 == 15 ? kept : pieces).push_back(p);  // every 16th stays: runs of 480 KiB between them
  }
  const int64_t held = test::anon_kib();
  ASSERT_GT(held, 64 << 10);
  for (void* p : pieces) std::free(p);
  const int64_t freed = test::anon_kib();
  EXPECT_GT(freed, held - (4 << 10)) << "free() alone keeps the pages";
  EXPECT_TRUE(release_free_heap());
  EXPECT_LT(test::anon_kib(), freed - (40 << 10)) << "released: most of the 60 MiB freed went back";
  for (void* p : kept) std::free(p);
}

TEST(HeapTrimPolicy, ReleasesOnceInTheStepAfterALargeOne) {
  HeapTrimPolicy p(256);
  EXPECT_FALSE(p.before_step(16));   // nothing large yet
  EXPECT_FALSE(p.before_step(900));  // a burst of prompts: its memory is needed now
  EXPECT_TRUE(p.before_step(16));    // the decodes after it: give it back
  EXPECT_FALSE(p.before_step(16));   // once
  EXPECT_FALSE(p.before_step(255));  // under the threshold: small enough to keep
  EXPECT_FALSE(p.before_step(1));
  EXPECT_FALSE(p.before_step(256));  // at the threshold
  EXPECT_TRUE(p.before_step(128));   // at most half of it
}

TEST(HeapTrimPolicy, RunsOfLargeStepsKeepTheirMemory) {
  HeapTrimPolicy p(256);
  for (int64_t t : {512, 400, 512, 300, 257}) EXPECT_FALSE(p.before_step(t)) << t;
  EXPECT_TRUE(p.before_step(256));   // half of the largest since the last release
  EXPECT_FALSE(p.before_step(200));  // 256 is the largest now
  EXPECT_TRUE(p.before_step(128));
}

TEST(HeapTrimPolicy, ZeroNeverReleases) {
  HeapTrimPolicy p(0);
  for (int64_t t : {0, 4096, 1, 4096, 0}) EXPECT_FALSE(p.before_step(t)) << t;
  EXPECT_EQ(HeapTrimPolicy().min_tokens(), HeapTrimPolicy::kDefaultMinTokens);
}

TEST(HeapTrimPolicy, ThresholdFromTheEnvironment) {
  EXPECT_EQ(HeapTrimPolicy::min_tokens_from(nullptr), HeapTrimPolicy::kDefaultMinTokens);
  EXPECT_EQ(HeapTrimPolicy::min_tokens_from("0"), 0);
  EXPECT_EQ(HeapTrimPolicy::min_tokens_from("1024"), 1024);
  for (const char* bad : {"", "-1", "+5", "12x", "lots", " 7", "99999999999999999999"}) {
    try {
      HeapTrimPolicy::min_tokens_from(bad);
      ADD_FAILURE() << "took '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("TROUPE_HEAP_TRIM"), std::string::npos) << e.what();
    }
  }
}

TEST(HeapPages, AddsTheTunablesToWhatIsSet) {
  EXPECT_EQ(simulator_tunables(nullptr, true), "glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=1024");
  EXPECT_EQ(simulator_tunables("", true), "glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=1024");
  EXPECT_EQ(simulator_tunables("glibc.malloc.arena_max=2", true),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=1024");
  // A longer name that starts the same is another tunable.
  EXPECT_EQ(simulator_tunables("glibc.malloc.hugetlbx=1", true),
            "glibc.malloc.hugetlbx=1:glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=1024");
  EXPECT_EQ(simulator_tunables("glibc.malloc.tcache_count_x=3", false),
            "glibc.malloc.tcache_count_x=3:glibc.malloc.tcache_count=1024");
}

TEST(HeapPages, TheTcacheWithoutHugePages) {
  // THP off in the kernel, or TROUPE_HEAP_THP=0: the tcache still.
  EXPECT_EQ(simulator_tunables(nullptr, false), "glibc.malloc.tcache_count=1024");
  EXPECT_EQ(simulator_tunables("glibc.malloc.arena_max=2", false),
            "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=1024");
}

TEST(HeapPages, LeavesTheUsersChoice) {
  EXPECT_EQ(simulator_tunables("glibc.malloc.hugetlb=0", true),
            "glibc.malloc.hugetlb=0:glibc.malloc.tcache_count=1024");
  EXPECT_EQ(simulator_tunables("glibc.malloc.tcache_count=7", true),
            "glibc.malloc.tcache_count=7:glibc.malloc.hugetlb=1");
  EXPECT_EQ(
      simulator_tunables("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2:glibc.malloc.tcache_count=9", true),
      std::nullopt);
  EXPECT_EQ(simulator_tunables("glibc.malloc.hugetlb:glibc.malloc.tcache_count", true), std::nullopt);
  EXPECT_EQ(simulator_tunables("glibc.malloc.tcache_count=7", false), std::nullopt);
}

TEST(HeapPages, ReadsTheKernelsMode) {
  EXPECT_TRUE(thp_mode_allows_advice("always [madvise] never\n"));
  EXPECT_TRUE(thp_mode_allows_advice("[always] madvise never\n"));
  EXPECT_FALSE(thp_mode_allows_advice("always madvise [never]\n"));
  EXPECT_FALSE(thp_mode_allows_advice(""));  // no THP in this kernel
}

// Sets `name` to `value` (nullopt: unsets it) for the scope; puts it back after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::optional<std::string>& v) {
    if (v) {
      setenv(name_, v->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  const char* name_;
  std::optional<std::string> old_;
};

TEST(HeapPages, HugePagesTurnedOffByTheEnvironmentNotTheTcache) {
  const ScopedEnv off("TROUPE_HEAP_THP", "0");
  const ScopedEnv tunables("GLIBC_TUNABLES", std::nullopt);
  EnvBefore previous{"not touched", "not touched"};
  ASSERT_TRUE(request_simulator_heap(previous, HeapAllocator::kGlibc));
  EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.tcache_count=1024");
  EXPECT_EQ(previous.name, "GLIBC_TUNABLES");
  EXPECT_EQ(previous.value, std::nullopt);  // it was unset
  restore_env(previous);
  EXPECT_EQ(std::getenv("GLIBC_TUNABLES"), nullptr);
}

TEST(HeapPages, RequestSetsAndRestoreUndoes) {
  const ScopedEnv on("TROUPE_HEAP_THP", std::nullopt);
  const ScopedEnv tunables("GLIBC_TUNABLES", "glibc.malloc.arena_max=4");
  EnvBefore previous;
  // Whether it asks for huge pages depends on this kernel's THP mode; the
  // tcache it always adds, and the environment says what it did.
  ASSERT_TRUE(request_simulator_heap(previous, HeapAllocator::kGlibc));
  const std::string set = std::getenv("GLIBC_TUNABLES");
  EXPECT_TRUE(set == "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=1024" ||
              set == "glibc.malloc.arena_max=4:glibc.malloc.tcache_count=1024")
      << set;
  EXPECT_EQ(heap_tcache_count(), "1024");
  EXPECT_EQ(previous.value, "glibc.malloc.arena_max=4");
  restore_env(previous);
  EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.arena_max=4");
  EXPECT_EQ(heap_tcache_count(), "");
  // Once set, nothing is left to ask: no second re-exec.
  const ScopedEnv both("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1:glibc.malloc.tcache_count=1024");
  EXPECT_FALSE(request_simulator_heap(previous, HeapAllocator::kGlibc));
}

TEST(HeapPages, MimallocIsAskedForHugePagesUnlessTheUserSaidOtherwise) {
  EXPECT_EQ(simulator_mimalloc_pages(nullptr, true), "1");
  EXPECT_EQ(simulator_mimalloc_pages(nullptr, false), std::nullopt);
  EXPECT_EQ(simulator_mimalloc_pages("0", true), std::nullopt);  // the user's
  EXPECT_EQ(simulator_mimalloc_pages("", true), std::nullopt);
  // core_tests links no mimalloc: glibc's malloc serves it.
  EXPECT_EQ(heap_allocator(), HeapAllocator::kGlibc);
}

TEST(HeapPages, UnderMimallocOnlyItsVariableIsSet) {
  const ScopedEnv tunables("GLIBC_TUNABLES", std::nullopt);
  const ScopedEnv pages("MIMALLOC_LARGE_OS_PAGES", std::nullopt);
  {
    const ScopedEnv off("TROUPE_HEAP_THP", "0");  // huge pages are all it asks mimalloc for
    EnvBefore previous;
    EXPECT_FALSE(request_simulator_heap(previous, HeapAllocator::kMimalloc));
    EXPECT_EQ(std::getenv("MIMALLOC_LARGE_OS_PAGES"), nullptr);
  }
  const ScopedEnv on("TROUPE_HEAP_THP", std::nullopt);
  EnvBefore previous;
  if (!request_simulator_heap(previous, HeapAllocator::kMimalloc)) {
    EXPECT_EQ(std::getenv("MIMALLOC_LARGE_OS_PAGES"), nullptr) << "THP is off here: nothing to ask";
    return;
  }
  EXPECT_STREQ(std::getenv("MIMALLOC_LARGE_OS_PAGES"), "1");
  EXPECT_EQ(std::getenv("GLIBC_TUNABLES"), nullptr) << "glibc's malloc serves nothing here";
  EXPECT_EQ(previous.name, "MIMALLOC_LARGE_OS_PAGES");
  EXPECT_EQ(previous.value, std::nullopt);
  EXPECT_FALSE(request_simulator_heap(previous, HeapAllocator::kMimalloc)) << "set once: no second re-exec";
  restore_env(previous);
  EXPECT_EQ(std::getenv("MIMALLOC_LARGE_OS_PAGES"), nullptr);
}

}  // namespace
}  // namespace troupe::core
