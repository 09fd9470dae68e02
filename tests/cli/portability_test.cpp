// The one build on CPUs it was not built on: the troupe binary of this build
// runs under QEMU's user-mode emulation of an AVX2-only CPU (Haswell: AVX2 +
// FMA, no AVX-512) and of the x86-64-v2 baseline (Nehalem: no AVX at all),
// picks the kernels those CPUs allow, and gives the same tokens as on the
// host. This is what a build made on an AVX-512 machine and copied to the
// others must do (no SIGILL). Skipped, saying so, without qemu-x86_64
// (scripts/setup.sh installs Debian's qemu-user).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jsonl.hpp"
#include "model/threading.hpp"
#include "test_utils.hpp"
#include "tiny_model.hpp"

namespace {

using nlohmann::json;
using troupe::test::run_command;
using troupe::test::shell_quote;

// Variables that tell a library which CPU it runs on, or which of its kernels
// to take, instead of letting it ask the CPU. A host may set them for its own
// CPU: some of our machines set OPENBLAS_CORETYPE=Haswell and
// OPENBLAS_L2_SIZE=512, which under an emulated Nehalem made OpenBLAS run its
// AVX2 kernels and die on the first ymm instruction (SIGILL). A real Nehalem
// would not have them, so the emulated run must not either: they are cleared
// for the emulated command only (the host's run, the rest of the suite and
// CI keep them).
constexpr const char* kHostCpuVariables[] = {
    "OPENBLAS_CORETYPE",        // OpenBLAS: the kernel set (Haswell, SkylakeX, ...)
    "OPENBLAS_L2_SIZE",         // OpenBLAS: the L2 size its blocking assumes
    "ATEN_CPU_CAPABILITY",      // libtorch: its own kernels' ISA (default, avx2, avx512)
    "TROUPE_CPU",               // troupe: its kernels' variant (model/cpu_features.hpp)
    "TROUPE_ONE_ROW_PREFETCH",  // troupe: where one row's products prefetch (model/cpu_features.hpp)
    "TROUPE_BF16_DOT",          // troupe: bfloat16 weights on vdpbf16ps or widened (model/cpu_features.hpp)
    "MKL_ENABLE_INSTRUCTIONS",  // MKL and oneDNN, should a libtorch built with them be used
    "MKL_DEBUG_CPU_TYPE",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_MAX_CPU_ISA",
};

// `env -u` for each of kHostCpuVariables.
std::string without_host_cpu_variables() {
  std::string cmd = "env";
  for (const char* name : kHostCpuVariables) cmd += std::string(" -u ") + name;
  return cmd + " ";
}

// A command line that runs `program` on `cpu` (QEMU's name for it; "" = the
// host itself), with the environment that CPU's machine would have.
std::string on_cpu(const std::string& cpu, const std::string& program) {
  if (cpu.empty()) return program;
  return without_host_cpu_variables() + "qemu-x86_64 -cpu " + cpu + " " + program;
}

// troupe-engine itself, with OMP_WAIT_POLICY and GOMP_SPINCOUNT as it wants
// them: otherwise it sets them and re-executes itself (model/threading.hpp),
// and that exec would leave the emulator and run on the host's CPU (as
// troupe's exec of troupe-engine would: the front is run on its own, below).
std::string under(const std::string& cpu) {
  return std::string("OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=") + troupe::model::kGompSpinCount + " " +
         on_cpu(cpu, shell_quote(troupe::test::troupe_engine_bin()));
}

bool have_qemu() { return run_command("command -v qemu-x86_64 >/dev/null").status == 0; }

using troupe::test::read_jsonl;

class Portability : public testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(Portability, TheBuildRunsOnTheLesserCpuWithItsKernelsAndTheSameTokens) {
  if (!have_qemu()) GTEST_SKIP() << "no qemu-x86_64 (scripts/setup.sh installs Debian's qemu-user)";
  const auto& [cpu, kernels] = GetParam();
  const auto version = run_command(under(cpu) + " --version 2>/dev/null", false);
  ASSERT_EQ(version.status, 0) << version.output;
  EXPECT_NE(version.output.find("kernels: " + kernels + " "), std::string::npos) << version.output;

  // Greedy, seeded top-p with logprobs, seeded top-k: the packed products,
  // paged attention and the sampler of that CPU's variant.
  troupe::test::TempDir dir;
  {
    std::ofstream jobs(dir.file("jobs.jsonl"));
    jobs
        << R"({"id":1,"prompt":"Hello world","max_tokens":8,"temperature":0})"
        << "\n"
        << R"({"id":2,"prompt":"The cluster","max_tokens":8,"temperature":0.9,"top_p":0.9,"seed":7,"logprobs":2})"
        << "\n"
        << R"({"id":3,"prompt_ids":[464,1893,318],"max_tokens":8,"temperature":1.0,"top_k":40,"seed":11})"
        << "\n";
  }
  auto batch = [&](const std::string& on, const std::string& out) {
    const auto r = run_command(on + " batch --quiet --num-blocks 64 --model " +
                               shell_quote(troupe::test::tiny_model_dir()) + " --input " +
                               shell_quote(dir.file("jobs.jsonl")) + " --output " + shell_quote(out));
    EXPECT_EQ(r.status, 0) << r.output;
    return read_jsonl(out);
  };
  const std::vector<json> host = batch(under(""), dir.file("host.jsonl"));
  const std::vector<json> emulated = batch(under(cpu), dir.file("emulated.jsonl"));
  ASSERT_EQ(host.size(), 3u);
  ASSERT_EQ(emulated.size(), 3u);
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(emulated[i]["ids"], host[i]["ids"]) << "job " << i + 1 << " on " << cpu;
    EXPECT_EQ(emulated[i]["ids"].size(), 8u);
  }
  // The front, troupe, runs the clients' commands on that CPU too.
  const auto tokens =
      run_command(on_cpu(cpu, shell_quote(troupe::test::troupe_bin())) + " tokenize --model " +
                      shell_quote(troupe::test::tiny_model_dir()) + " 'Hello world'",
                  false);
  EXPECT_EQ(tokens.status, 0) << tokens.output;
  EXPECT_EQ(tokens.output, "[15496,995]\n");
}

// Whatever the host sets for its own CPU stays out of the emulated CPU's
// environment: here the host's settings are forced to the ones that broke
// the Nehalem run on our AMD machines, so this holds on any host.
TEST(PortabilityEnvironment, TheEmulatedCpuDoesNotInheritTheHostsCpuSettings) {
  if (!have_qemu()) GTEST_SKIP() << "no qemu-x86_64 (scripts/setup.sh installs Debian's qemu-user)";
  std::string host_settings;
  for (const char* name : kHostCpuVariables) host_settings += std::string(name) + "=host ";
  const auto host = run_command("env " + host_settings + "env");
  const auto emulated = run_command("env " + host_settings + on_cpu("Nehalem", "/usr/bin/env"));
  ASSERT_EQ(emulated.status, 0) << emulated.output;
  EXPECT_NE(emulated.output.find("PATH="), std::string::npos) << "the rest of the environment is kept";
  for (const char* name : kHostCpuVariables) {  // one variable a line: "\nNAME=" is that variable alone
    EXPECT_NE(("\n" + host.output).find("\n" + std::string(name) + "=host"), std::string::npos) << name;
    EXPECT_EQ(("\n" + emulated.output).find("\n" + std::string(name) + "="), std::string::npos)
        << name << " reached the emulated CPU";
  }
}

INSTANTIATE_TEST_SUITE_P(Cpus, Portability,
                         testing::Values(std::make_pair(std::string("Haswell"), std::string("avx2")),
                                         std::make_pair(std::string("Nehalem"), std::string("portable"))),
                         [](const auto& info) { return info.param.first; });

}  // namespace
