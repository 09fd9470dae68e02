#include "model/threading.hpp"

#include <dlfcn.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <ATen/Parallel.h>

#include "core/heap_pages.hpp"

#include "model/cpu_count.hpp"
#include "model/kernel_team.hpp"

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

std::vector<ThreadBudget> split_thread_budget(int cpus, int workers, int per_worker) {
  if (cpus < 1 || workers < 1)
    throw std::invalid_argument("split_thread_budget: need at least 1 CPU and 1 worker, got " +
                                std::to_string(cpus) + " CPUs for " + std::to_string(workers) + " workers");
  if (per_worker < 0)
    throw std::invalid_argument("split_thread_budget: threads per worker must be >= 0, got " +
                                std::to_string(per_worker));
  std::vector<ThreadBudget> out(workers);
  for (int w = 0; w < workers; ++w) {
    out[w].intra_op_threads =
        per_worker > 0 ? per_worker : std::max(1, cpus / workers + (w < cpus % workers ? 1 : 0));
    out[w].blas_threads = workers == 1 ? out[w].intra_op_threads : 1;
  }
  return out;
}

void apply_thread_budget(const ThreadBudget& budget) {
  if (budget.intra_op_threads < 1 || budget.blas_threads < 1)
    throw std::invalid_argument("apply_thread_budget: thread counts must be >= 1, got intra_op " +
                                std::to_string(budget.intra_op_threads) + ", blas " +
                                std::to_string(budget.blas_threads));
  // at::get_num_threads runs ATen's once-per-thread init (it copies ATen's
  // process-wide count into this thread's team size); after it, nothing in
  // ATen resets this thread's team size behind our back.
  (void)at::get_num_threads();
  omp_set_num_threads(budget.intra_op_threads);
  set_blas_threads(budget.blas_threads);
}

void init_numerics_process(int argc, char** argv) {
  (void)argc;
  // What libgomp reads once, when it is loaded.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    const bool own_spin = std::getenv("GOMP_SPINCOUNT") == nullptr;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    if (own_spin) setenv("GOMP_SPINCOUNT", kGompSpinCount, 1);
    execv("/proc/self/exe", argv);
    // exec failed (no /proc?): libgomp keeps its defaults; do not claim otherwise.
    unsetenv("OMP_WAIT_POLICY");
    if (own_spin) unsetenv("GOMP_SPINCOUNT");
  }
  core::tune_malloc();
}

void configure_threads(const ThreadOptions& options) {
  int intra = options.intra_op_threads > 0 ? options.intra_op_threads : env_int("TROUPE_THREADS");
  if (intra <= 0) intra = usable_cpus();
  const int blas = options.blas_threads > 0 ? options.blas_threads : intra;
  at::set_num_threads(intra);  // the default of threads that have not run ATen yet
  apply_thread_budget({intra, blas});
}

const char* thread_summary() {
  static thread_local std::string s;
  const CpuCount c = count_cpus();
  const char* wp = std::getenv("OMP_WAIT_POLICY");
  const char* sc = std::getenv("GOMP_SPINCOUNT");
  char quota[32] = "no quota";
  if (c.quota > 0) std::snprintf(quota, sizeof quota, "quota %.2f", c.quota);
  s = "cpus=" + std::to_string(c.usable) + " (affinity " + std::to_string(c.affinity) + ", " + quota +
      ") omp=" + std::to_string(at::get_num_threads()) + " blas=" + std::to_string(get_blas_threads()) +
      " omp_wait_policy=" + (wp && *wp ? wp : "unset") + " gomp_spincount=" + (sc && *sc ? sc : "unset") +
      " malloc=" + (core::malloc_tuned() ? "tuned" : "default") +
      // passes of up to this many tokens run on kernel teams (kernel_team.hpp)
      " kernel_teams=" + (kernel_team_enabled() ? std::to_string(kTeamMaxTokens) : std::string("off"));
  return s.c_str();
}

}  // namespace troupe::model
