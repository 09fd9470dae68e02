// `troupe --version` and the kernel variant choice as a user meets them:
// the CPU and the variant are printed, TROUPE_CPU forces a lower variant,
// and a variant the CPU cannot run (or a misspelt one) is a clear error.
#include <gtest/gtest.h>

#include <string>

#include "model/cpu_features.hpp"
#include "test_utils.hpp"

namespace {

using troupe::test::run_command;
using troupe::test::shell_quote;

std::string troupe(const std::string& env, const std::string& args) {
  return env + " " + shell_quote(troupe::test::troupe_bin()) + " " + args;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Version, PrintsVersionCpuAndKernels) {
  const auto r = run_command(troupe("env -u TROUPE_CPU", "--version"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "troupe 0.")) << r.output;
  EXPECT_TRUE(contains(r.output, "cpu: " + troupe::model::cpu_model_name())) << r.output;
  const std::string best = troupe::model::to_string(troupe::model::best_isa());
  EXPECT_TRUE(contains(r.output, "kernels: " + best)) << r.output;
}

TEST(Version, TroupeCpuForcesALowerVariant) {
  const auto r = run_command(troupe("TROUPE_CPU=portable", "--version"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "kernels: portable")) << r.output;
}

TEST(Version, UnknownTroupeCpuIsAnErrorBeforeAnyWork) {
  // The model folder does not exist either: the variant is checked first.
  const auto r = run_command(troupe("TROUPE_CPU=avx9000", "generate --model /nonexistent --prompt-ids 1"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "TROUPE_CPU")) << r.output;
  EXPECT_TRUE(contains(r.output, "avx9000")) << r.output;
}

TEST(Version, NamesTheOneRowPrefetchAndRefusesABadOneBeforeAnyWork) {
  const auto r = run_command(troupe("TROUPE_ONE_ROW_PREFETCH=l1", "--version"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "one-row prefetch into L1")) << r.output;
  const auto bad =
      run_command(troupe("TROUPE_ONE_ROW_PREFETCH=l7", "generate --model /nonexistent --prompt-ids 1"));
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_TRUE(contains(bad.output, "TROUPE_ONE_ROW_PREFETCH: 'l7'")) << bad.output;
}

TEST(Version, NamesTheBfloat16ArithmeticAndRefusesABadChoiceBeforeAnyWork) {
  if (troupe::model::best_isa() == troupe::model::CpuIsa::kAvx512Bf16) {
    const auto widened = run_command(troupe("TROUPE_BF16_DOT=0", "--version"));
    ASSERT_EQ(widened.status, 0) << widened.output;
    EXPECT_TRUE(contains(widened.output, "bfloat16 weights widened to fp32")) << widened.output;
    const auto dot = run_command(troupe("TROUPE_BF16_DOT=1", "--version"));
    EXPECT_TRUE(contains(dot.output, "vdpbf16ps for bfloat16")) << dot.output;
  }
  const auto bad = run_command(troupe("TROUPE_BF16_DOT=yes", "generate --model /nonexistent --prompt-ids 1"));
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_TRUE(contains(bad.output, "TROUPE_BF16_DOT: 'yes'")) << bad.output;
}

TEST(Version, TroupeCpuAboveTheCpuIsAnError) {
  const troupe::model::CpuIsa top = troupe::model::all_isas().back();
  if (troupe::model::best_isa() == top) GTEST_SKIP() << "this CPU runs every variant: no TROUPE_CPU to refuse";
  const std::string env = std::string("TROUPE_CPU=") + troupe::model::to_string(top);
  const auto r = run_command(troupe(env, "generate --model /nonexistent --prompt-ids 1"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, env)) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot run")) << r.output;
}

}  // namespace
