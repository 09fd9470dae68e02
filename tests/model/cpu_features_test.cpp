#include "model/cpu_features.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace troupe::model {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(CpuFeatures, NamesRoundTripAndUnknownNamesListTheChoices) {
  for (CpuIsa isa : all_isas()) EXPECT_EQ(parse_isa(to_string(isa)), isa);
  try {
    parse_isa("avx1024");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "avx1024")) << e.what();
    EXPECT_TRUE(contains(e.what(), "portable, avx2, avx512 or avx512bf16")) << e.what();
  }
}

TEST(CpuFeatures, BestIsTheHighestSupportedAndSupportIsDownwardClosed) {
  ASSERT_TRUE(cpu_supports(CpuIsa::kPortable));  // the baseline build would not have started otherwise
  EXPECT_TRUE(cpu_supports(best_isa()));
  EXPECT_TRUE(why_unsupported(best_isa()).empty());
  for (CpuIsa isa : all_isas()) {
    if (static_cast<int>(isa) > static_cast<int>(best_isa())) {
      EXPECT_FALSE(cpu_supports(isa)) << to_string(isa);
      EXPECT_TRUE(contains(why_unsupported(isa), cpu_model_name())) << why_unsupported(isa);
    } else {
      EXPECT_TRUE(cpu_supports(isa)) << to_string(isa);
    }
  }
  EXPECT_FALSE(cpu_model_name().empty());
}

TEST(CpuFeatures, TroupeCpuPicksALowerVariantAndRejectsWhatCannotRun) {
  EXPECT_EQ(choose_kernel_isa(nullptr), best_isa());
  EXPECT_EQ(choose_kernel_isa(""), best_isa());
  EXPECT_EQ(choose_kernel_isa("portable"), CpuIsa::kPortable);
  try {
    choose_kernel_isa("sse2");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "TROUPE_CPU")) << e.what();
    EXPECT_TRUE(contains(e.what(), "sse2")) << e.what();
  }
}

TEST(CpuFeatures, TroupeCpuAboveWhatTheCpuRunsIsAnError) {
  const CpuIsa top = all_isas().back();
  if (best_isa() == top) GTEST_SKIP() << "this CPU runs every variant: no request to reject";
  try {
    choose_kernel_isa(to_string(top));
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), std::string("TROUPE_CPU=") + to_string(top))) << e.what();
    EXPECT_TRUE(contains(e.what(), "cannot run")) << e.what();
  }
}

TEST(CpuFeatures, SetKernelIsaSwitchesAndScopesRestore) {
  const CpuIsa before = kernel_isa();
  {
    ScopedKernelIsa scope(CpuIsa::kPortable);
    EXPECT_EQ(kernel_isa(), CpuIsa::kPortable);
    EXPECT_TRUE(contains(kernel_summary(), "kernels: portable")) << kernel_summary();
  }
  EXPECT_EQ(kernel_isa(), before);
  EXPECT_TRUE(contains(kernel_summary(), cpu_model_name())) << kernel_summary();
  EXPECT_TRUE(contains(kernel_summary(), std::string("kernels: ") + to_string(before))) << kernel_summary();
}

TEST(CpuFeatures, SetKernelIsaRefusesWhatTheCpuCannotRunAndChangesNothing) {
  const CpuIsa top = all_isas().back();
  if (best_isa() == top) GTEST_SKIP() << "this CPU runs every variant: nothing to refuse";
  const CpuIsa before = kernel_isa();
  EXPECT_THROW(set_kernel_isa(top), std::invalid_argument);
  EXPECT_EQ(kernel_isa(), before);
}

TEST(CpuFeatures, OneRowPrefetchIsL1OnAmdL2ElsewhereUnlessTheEnvironmentSays) {
  EXPECT_EQ(choose_one_row_prefetch(nullptr, true), CacheLevel::kL1);
  EXPECT_EQ(choose_one_row_prefetch("", true), CacheLevel::kL1);
  EXPECT_EQ(choose_one_row_prefetch(nullptr, false), CacheLevel::kL2);
  EXPECT_EQ(choose_one_row_prefetch("l2", true), CacheLevel::kL2);
  EXPECT_EQ(choose_one_row_prefetch("L1", false), CacheLevel::kL1);
  for (const char* bad : {"l3", "t0", " l1", "1"}) {
    try {
      choose_one_row_prefetch(bad, true);
      FAIL() << bad << ": no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(contains(e.what(), "TROUPE_ONE_ROW_PREFETCH")) << e.what();
      EXPECT_TRUE(contains(e.what(), bad)) << e.what();
    }
  }
  // The process's own: this CPU's default unless the variable chose one, and
  // the same on every call; --version and bench headers name it.
  const char* env = std::getenv("TROUPE_ONE_ROW_PREFETCH");
  const bool amd = __builtin_cpu_is("amd");
  CacheLevel want = choose_one_row_prefetch(nullptr, amd);
  try {
    want = choose_one_row_prefetch(env, amd);
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(one_row_prefetch(), want);
  EXPECT_EQ(one_row_prefetch(), want);
  EXPECT_TRUE(contains(kernel_summary(), std::string("one-row prefetch into ") + to_string(want)))
      << kernel_summary();
}

}  // namespace
}  // namespace troupe::model
