#include "model/threading.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/Parallel.h>

namespace troupe::model {
namespace {

// OpenBLAS is reached through libblas.so.3 (Debian's alternatives), so its
// thread control is looked up at run time instead of linked.
void set_blas_threads(int n) {
  using Fn = void (*)(int);
  if (auto f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
}

int get_blas_threads() {
  using Fn = int (*)();
  if (auto f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) return f();
  return -1;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end && *end == '\0' && n > 0 && n < 4096) ? static_cast<int>(n) : 0;
}

}  // namespace

void ensure_passive_openmp(int argc, char** argv) {
  (void)argc;
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);
  // exec failed (no /proc?): carry on with active waiting rather than die.
}

void configure_threads(const ThreadOptions& options) {
  int intra = options.intra_op_threads > 0 ? options.intra_op_threads : env_int("TROUPE_THREADS");
  if (intra <= 0) intra = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int blas = options.blas_threads > 0 ? options.blas_threads : intra;
  at::set_num_threads(intra);
  set_blas_threads(blas);
}

const char* thread_summary() {
  static thread_local std::string s;
  const char* wp = std::getenv("OMP_WAIT_POLICY");
  s = "torch=" + std::to_string(at::get_num_threads()) + " blas=" + std::to_string(get_blas_threads()) +
      " omp_wait_policy=" + (wp ? wp : "default");
  return s.c_str();
}

}  // namespace troupe::model
