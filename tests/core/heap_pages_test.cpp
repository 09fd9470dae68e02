#include "core/heap_pages.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
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

TEST(HeapPages, AddsTheTunableToWhatIsSet) {
  EXPECT_EQ(tunables_with_heap_thp(nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(tunables_with_heap_thp(""), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(tunables_with_heap_thp("glibc.malloc.arena_max=2"),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  // A longer name that starts the same is another tunable.
  EXPECT_EQ(tunables_with_heap_thp("glibc.malloc.hugetlbx=1"),
            "glibc.malloc.hugetlbx=1:glibc.malloc.hugetlb=1");
}

TEST(HeapPages, LeavesTheUsersChoice) {
  EXPECT_EQ(tunables_with_heap_thp("glibc.malloc.hugetlb=0"), std::nullopt);
  EXPECT_EQ(tunables_with_heap_thp("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"), std::nullopt);
  EXPECT_EQ(tunables_with_heap_thp("glibc.malloc.hugetlb"), std::nullopt);
}

TEST(HeapPages, ReadsTheKernelsMode) {
  EXPECT_TRUE(thp_mode_allows_advice("always [madvise] never\n"));
  EXPECT_TRUE(thp_mode_allows_advice("[always] madvise never\n"));
  EXPECT_FALSE(thp_mode_allows_advice("always madvise [never]\n"));
  EXPECT_FALSE(thp_mode_allows_advice(""));  // no THP in this kernel
}

TEST(HeapPages, TurnedOffByTheEnvironment) {
  const char* old = std::getenv("TROUPE_HEAP_THP");
  const std::optional<std::string> keep = old ? std::optional<std::string>(old) : std::nullopt;
  setenv("TROUPE_HEAP_THP", "0", 1);
  std::optional<std::string> previous;
  EXPECT_FALSE(request_heap_huge_pages(previous));
  if (keep) {
    setenv("TROUPE_HEAP_THP", keep->c_str(), 1);
  } else {
    unsetenv("TROUPE_HEAP_THP");
  }
}

TEST(HeapPages, RequestSetsAndRestoreUndoes) {
  const char* old = std::getenv("GLIBC_TUNABLES");
  const std::optional<std::string> keep = old ? std::optional<std::string>(old) : std::nullopt;
  const char* off = std::getenv("TROUPE_HEAP_THP");
  const std::optional<std::string> keep_off = off ? std::optional<std::string>(off) : std::nullopt;
  unsetenv("TROUPE_HEAP_THP");
  setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4", 1);
  std::optional<std::string> previous;
  // Whether it changes anything depends on this kernel's THP mode; either
  // way the environment says what it did.
  if (request_heap_huge_pages(previous)) {
    EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1");
    EXPECT_EQ(previous, "glibc.malloc.arena_max=4");
    restore_tunables(previous);
  }
  EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.arena_max=4");
  restore_tunables(keep);
  if (keep_off) setenv("TROUPE_HEAP_THP", keep_off->c_str(), 1);
}

}  // namespace
}  // namespace troupe::core
