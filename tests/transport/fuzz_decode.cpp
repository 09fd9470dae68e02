// libFuzzer target for transport::decode (built with clang only; see
// CMakeLists.txt). It checks the property of decode_check.hpp and traps when
// it fails. Seeds: run once with TROUPE_FUZZ_SEEDS=DIR to write one frame of
// every message type into DIR, then fuzz with DIR as the corpus:
//
//   TROUPE_FUZZ_SEEDS=corpus ./fuzz_decode -runs=0 corpus
//   ./fuzz_decode -max_total_time=300 -max_len=4096 corpus
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "decode_check.hpp"
#include "sample_messages.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("TROUPE_FUZZ_SEEDS")) {
    int i = 0;
    for (const auto& m : troupe::transport::test::sample_messages()) {
      std::ofstream out(std::string(dir) + "/seed-" + std::to_string(i++) + "-" +
                        troupe::transport::type_name(m));
      out << troupe::transport::encode(m);
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto problem = troupe::transport::test::check_decode(
      std::string_view(reinterpret_cast<const char*>(data), size), /*max_frame_bytes=*/1 << 20);
  if (problem) {
    std::fprintf(stderr, "decode property failed: %s\n", problem->c_str());
    __builtin_trap();
  }
  return 0;
}
