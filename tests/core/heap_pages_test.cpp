#include "core/heap_pages.hpp"

#include <gtest/gtest.h>

namespace troupe::core {
namespace {

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
