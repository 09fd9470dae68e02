// The main() of every test binary. The tests run under the threading policy
// the shipped binary runs under (cli/main.cpp, model/threading.hpp): libgomp
// loaded with OMP_WAIT_POLICY=PASSIVE (unless the user set one) and one
// OpenMP/BLAS thread per usable CPU. A main rather than ctest ENVIRONMENT
// properties so that running a test binary by hand (and gtest's test
// discovery) gets the same policy as ctest, from the same code as `troupe`.
#include <gtest/gtest.h>

#include "model/threading.hpp"

int main(int argc, char** argv) {
  troupe::model::ensure_passive_openmp(argc, argv);
  troupe::model::configure_threads({});
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
