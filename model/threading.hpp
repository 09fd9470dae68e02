#pragma once
// Threading policy for the numerics, decided on purpose (docs/threading.md).
//
// Pools: libtorch's intra-op pool and our kernels' at::parallel_for are
// OpenMP (libgomp), but for passes of at most 32 tokens, whose kernels run on
// kernel teams (kernel_team.hpp); at:: GEMMs that reach BLAS run on
// OpenBLAS's own pthread pool. What holds, checked by tests/model/threading_test.cpp:
// - libgomp's team size (nthreads-var) is per thread: each worker thread sets
//   its own with omp_set_num_threads and gets its own team of pool threads.
// - at::set_num_threads is not per thread: besides this thread's team size it
//   stores a process-wide value that ATen copies into every thread on that
//   thread's first at::parallel_for (at::init_num_threads). A worker that set
//   its own count before its first parallel region can thus get another
//   worker's. apply_thread_budget() forces that first copy, then sets the
//   team size directly.
// - OpenBLAS's thread count is one per process.
// - OMP_WAIT_POLICY is read once, when libgomp is loaded: init_numerics_process()
//   re-executes the program with it set.

#include <vector>

#include "core/heap_pages.hpp"

namespace troupe::model {

struct ThreadOptions {
  int intra_op_threads =
      0;  // OpenMP threads of the process; 0 = TROUPE_THREADS, else usable CPUs (cpu_count.hpp)
  int blas_threads = 0;  // OpenBLAS threads; 0 = same as intra_op_threads
};

// The threads one worker may use.
struct ThreadBudget {
  int intra_op_threads = 1;  // OpenMP team size of the worker's own parallel regions; >= 1
  int blas_threads = 1;      // OpenBLAS threads; process-wide, so equal in every budget of one split; >= 1
};

// Splits `cpus` usable CPUs among `workers` workers of one process so that
// they run `cpus` compute threads in all, not workers x cpus: cpus / workers
// each and one more for the first cpus % workers; at least 1 each (more
// workers than CPUs oversubscribe, one thread each). BLAS gets the intra-op
// count with one worker, 1 thread with several: its pool is process-wide and
// troupe's own kernels do the projections (docs/threading.md says why;
// docs/benchmarks.md "Threading policy" has the numbers).
// per_worker > 0 (`--threads-per-worker`) gives each worker that many threads
// instead, BLAS included with one worker: a BLAS pool wider than the worker's
// budget would spin on the CPUs left to the head and its clients.
// Throws std::invalid_argument unless cpus >= 1, workers >= 1, per_worker >= 0.
std::vector<ThreadBudget> split_thread_budget(int cpus, int workers, int per_worker = 0);

// Applies `budget` on the calling thread and only there (OpenBLAS's count
// aside, which is process-wide): call it first on a worker's own thread,
// before its first forward pass. Leaves ATen's process-wide default alone.
// Throws std::invalid_argument if a count is < 1.
void apply_thread_budget(const ThreadBudget& budget);

// libgomp's spin before a PASSIVE thread sleeps, as the policy sets it: a
// few microseconds, enough to carry a team across the short gaps between the
// parallel regions of one forward pass, never across the gaps between steps
// (docs/benchmarks.md "Threading policy" has the measurement).
inline constexpr const char* kGompSpinCount = "3000";

// Call first thing in main() of a program that runs kernels (troupe calls it
// only for the commands that may: cli/main.cpp). Unless the user set OMP_WAIT_POLICY, re-executes
// the program with OMP_WAIT_POLICY=PASSIVE and (unless the user set it)
// GOMP_SPINCOUNT=kGompSpinCount, both read by libgomp once, when it is loaded;
// returns only if no re-exec was needed or it failed. A user's own
// OMP_WAIT_POLICY is kept as it is. Then tunes malloc for forward passes
// (core::tune_malloc). (`troupe simulate` runs no kernels: its heap's re-exec is
// core::reexec_with_simulator_heap's.)
void init_numerics_process(int argc, char** argv);

// core::tune_malloc (core/heap_pages.hpp), here for the model's callers.
using core::tune_malloc;

// One worker in the process: applies the options on the calling thread and
// makes them ATen's process-wide default. Reads TROUPE_THREADS when
// intra_op_threads is 0.
void configure_threads(const ThreadOptions& options);

// "cpus=2 (affinity 2, no quota) omp=2 blas=2 omp_wait_policy=PASSIVE gomp_spincount=3000 malloc=tuned" for
// logs and bench headers; omp is the calling thread's team size.
const char* thread_summary();

}  // namespace troupe::model
