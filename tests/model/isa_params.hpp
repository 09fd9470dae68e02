#pragma once
// Kernel-variant parameters for TEST_P suites: every variant gets its own
// test instance, and one the CPU cannot run is skipped with the reason
// (GTEST_SKIP), so a run says plainly which variants it did not test.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "model/cpu_features.hpp"

namespace troupe::test {

inline std::string isa_name(const ::testing::TestParamInfo<model::CpuIsa>& info) {
  return model::to_string(info.param);
}

}  // namespace troupe::test

// In a TEST_P body: skip unless this CPU runs `isa`.
#define TROUPE_SKIP_UNLESS_CPU_RUNS(isa) \
  if (!::troupe::model::cpu_supports(isa)) GTEST_SKIP() << ::troupe::model::why_unsupported(isa)

namespace troupe::model {
// gtest prints a failing instance's parameter by name.
inline void PrintTo(CpuIsa isa, std::ostream* os) { *os << to_string(isa); }
}  // namespace troupe::model
