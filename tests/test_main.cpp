// The main() of every test binary. The tests run under the threading policy
// the shipped binary runs under (cli/main.cpp, model/threading.hpp): libgomp
// loaded with OMP_WAIT_POLICY=PASSIVE (unless the user set one) and one
// OpenMP/BLAS thread per usable CPU. A main, not only ctest's ENVIRONMENT
// property (CMakeLists.txt sets that too, to spare ctest the re-exec), so that
// a test binary run by hand gets the same policy, from the same code as `troupe`.
#include <gtest/gtest.h>

#include "model/threading.hpp"

#if defined(__SANITIZE_ADDRESS__)
// The sanitizer build (TROUPE_SANITIZE): a stack with every UBSan finding,
// which -fno-sanitize-recover makes fatal. UBSAN_OPTIONS still overrides it.
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1"; }
#endif

int main(int argc, char** argv) {
  troupe::model::init_numerics_process(argc, argv);
  troupe::model::configure_threads({});
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
