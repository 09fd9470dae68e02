#pragma once
// Physical limits of the machine a benchmark runs on, measured in the same
// run as the figures compared with them (bench/bench_limits.cpp, ...):
//  * the fp32 multiply-add peak: a loop of independent register FMAs
//    (multiply + add on the portable variant) on every thread, with the
//    instructions of one kernel variant;
//  * the streaming read bandwidth: every thread summing its share of a
//    buffer far larger than the caches.
// And what a report needs beside them: resident memory, the CPU and the
// kernels chosen.
#include <cstddef>
#include <memory>
#include <string>

#include "model/cpu_features.hpp"

namespace troupe::bench {

// GFLOP/s of `threads` threads (0 = at::get_num_threads()) each running
// independent multiply-adds in registers with `isa`'s widest vectors, best of
// a few ~0.2 s runs. Throws std::invalid_argument if the CPU cannot run isa.
// bf16_dot: with the bfloat16 dot product instead (vdpbf16ps, avx512bf16
// only: std::invalid_argument elsewhere), the peak of bfloat16 weights there.
double fma_peak_gflops(model::CpuIsa isa, int threads = 0, bool bf16_dot = false);

// GB/s (1e9 bytes) of `threads` threads (0 = at::get_num_threads()) reading
// a `bytes` buffer (default 1 GiB) once through, each its own contiguous
// share, with the best variant's loads; best of `passes`.
double read_bandwidth_gbs(size_t bytes = size_t{1} << 30, int threads = 0, int passes = 5);

// The same read on a buffer kept between calls, for figures paired with the
// bandwidth of the same moment (bench_limits --floor): allocated and written
// once; gbs() reads it `passes` times and returns the best, in GB/s.
class ReadProbe {
 public:
  explicit ReadProbe(size_t bytes = size_t{512} << 20, int threads = 0);
  double gbs(int passes = 1);

 private:
  int threads_;
  size_t count_;
  std::unique_ptr<float, void (*)(void*)> mem_;
};

// Peak and current resident set of this process, MiB (VmHWM, VmRSS of
// /proc/self/status; -1 when unreadable).
double peak_rss_mib();
double rss_mib();
// Resets VmHWM to the current RSS (Linux clear_refs 5); false if refused.
bool reset_peak_rss();

// The largest data cache cpu0 sees (its last level, the L3 on the x86 CPUs
// here), from sysfs; 0 when unreadable.
size_t last_level_cache_bytes();

// "cpu: ... | kernels: ... | supported: ... | torch=2 blas=2 omp_wait_policy=PASSIVE"
std::string machine_line();

}  // namespace troupe::bench
