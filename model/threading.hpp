#pragma once
// Threading policy for the numerics, decided on purpose (docs/threading.md):
// libtorch's intra-op pool is OpenMP (libgomp), GEMMs go to OpenBLAS's own
// pthread pool. With both spinning on 2 cores they fight: measured 3-4x slower
// batched decode at batch 16/64. OMP_WAIT_POLICY=PASSIVE makes idle OpenMP
// workers sleep instead of spin, which fixes it. libgomp reads that variable
// once, when it is loaded, so a process that wants it must have it in its
// environment from the start: ensure_passive_openmp() re-executes the program
// with it set (once; a user's own OMP_WAIT_POLICY is respected).

namespace troupe::model {

struct ThreadOptions {
  int intra_op_threads = 0;  // libtorch intra-op threads; 0 = number of online CPUs
  int blas_threads = 0;      // OpenBLAS threads; 0 = same as intra_op_threads
};

// Call first thing in main(). Returns only if no re-exec was needed or it failed.
void ensure_passive_openmp(int argc, char** argv);

// Applies the options; reads TROUPE_THREADS (intra-op) when the field is 0.
void configure_threads(const ThreadOptions& options);

// "torch=2 blas=2 omp_wait_policy=PASSIVE" — for logs and bench headers.
const char* thread_summary();

}  // namespace troupe::model
