// ChildProcess (cluster/loadgen/child_process.hpp): the processes that
// `troupe profile --head` and the tests start, on the CPUs they are given.
#include "cluster/loadgen/child_process.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "model/cpu_count.hpp"
#include "test_utils.hpp"

namespace troupe::cluster {
namespace {

TEST(ChildProcess, RunsOnTheCpusItIsGiven) {
  const std::vector<int> all = model::affinity_cpu_list();
  ASSERT_FALSE(all.empty());
  test::TempDir d;
  ChildProcess p({"grep", "Cpus_allowed_list", "/proc/self/status"}, d.file("log"), {all.back()});
  ASSERT_EQ(p.wait(std::chrono::seconds(20)), 0) << p.log();
  EXPECT_NE(p.log().find("\t" + std::to_string(all.back()) + "\n"), std::string::npos) << p.log();
  ChildProcess q({"grep", "Cpus_allowed_list", "/proc/self/status"}, d.file("log2"));
  ASSERT_EQ(q.wait(std::chrono::seconds(20)), 0) << q.log();
  // Without CPUs it keeps its parent's (all of them, here more than the one above).
  if (all.size() > 1) {
    EXPECT_EQ(q.log().find("\t" + std::to_string(all.back()) + "\n"), std::string::npos) << q.log();
  }
}

TEST(ChildProcess, RefusesACpuItCouldNotPinWithoutAllocating) {
  test::TempDir d;
  // Between fork and exec the child may not allocate: numbers past
  // cpu_set_t's fixed size are refused before the fork.
  EXPECT_THROW(ChildProcess({"true"}, d.file("log"), {CPU_SETSIZE}), std::invalid_argument);
  EXPECT_THROW(ChildProcess({"true"}, d.file("log"), {-1}), std::invalid_argument);
  // A CPU the machine does not have: the child cannot pin itself and exits 126.
  ChildProcess p({"true"}, d.file("log2"), {CPU_SETSIZE - 1});
  EXPECT_EQ(p.wait(std::chrono::seconds(20)), 126);
}

}  // namespace
}  // namespace troupe::cluster
