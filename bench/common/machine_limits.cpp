#include "machine_limits.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>

#include "machine_limits_kernels.hpp"
#include "model/threading.hpp"

namespace troupe::bench {
namespace {

using Clock = std::chrono::steady_clock;

const LimitLoops& loops(model::CpuIsa isa) {
  switch (isa) {
    case model::CpuIsa::kAvx512Bf16:
      return avx512bf16::kLimitLoops;
    case model::CpuIsa::kAvx512:
      return avx512::kLimitLoops;
    case model::CpuIsa::kAvx2:
      return avx2::kLimitLoops;
    case model::CpuIsa::kPortable:
      return portable::kLimitLoops;
  }
  return portable::kLimitLoops;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs fn(t) on threads t = 0..n-1 at once; returns the wall time in seconds.
template <typename Fn>
double on_threads(int n, const Fn& fn) {
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (int t = 0; t < n; ++t) pool.emplace_back([&fn, t] { fn(t); });
  for (auto& th : pool) th.join();
  return seconds_since(t0);
}

double status_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size())) / 1024.0;  // kB
  return -1;
}

}  // namespace

double fma_peak_gflops(model::CpuIsa isa, int threads, bool bf16_dot) {
  if (!model::cpu_supports(isa))
    throw std::invalid_argument("fma_peak_gflops: " + model::why_unsupported(isa));
  const int n = threads > 0 ? threads : at::get_num_threads();
  if (bf16_dot && !loops(isa).dot_bf16)
    throw std::invalid_argument(std::string("fma_peak_gflops: the ") + model::to_string(isa) +
                                " variant has no bfloat16 dot product");
  double (*const loop)(int64_t) = bf16_dot ? loops(isa).dot_bf16 : loops(isa).fma;
  // Calibrate to ~0.2 s per run on one thread.
  int64_t iters = int64_t{1} << 16;
  for (;;) {
    const auto t0 = Clock::now();
    loop(iters);
    const double s = seconds_since(t0);
    if (s > 0.02) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * 0.2 / s);
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> flops(static_cast<size_t>(n));
    const double s = on_threads(n, [&](int t) { flops[static_cast<size_t>(t)] = loop(iters); });
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / s * 1e-9);
  }
  return best;
}

ReadProbe::ReadProbe(size_t bytes, int threads)
    : threads_(threads > 0 ? threads : at::get_num_threads()),
      count_(bytes / sizeof(float)),
      mem_(nullptr, std::free) {
  // In 2 MiB pages advised for transparent huge pages, like Linear's packed
  // weights: with 4 KiB pages the TLB misses and the prefetchers' stops at
  // each page would make the floor easier to beat than the weights' stream.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t rounded = (count_ * sizeof(float) + kHuge - 1) / kHuge * kHuge;
  mem_.reset(static_cast<float*>(std::aligned_alloc(kHuge, rounded)));
  if (!mem_) throw std::bad_alloc();
  madvise(mem_.get(), rounded, MADV_HUGEPAGE);
  std::fill_n(mem_.get(), count_, 1.0f);  // written once: every page resident
}

double ReadProbe::gbs(int passes) {
  const LimitLoops& l = loops(model::best_isa());
  const int n = threads_;
  std::vector<float> sink(static_cast<size_t>(n));
  std::vector<Clock::time_point> done(static_cast<size_t>(n));
  float* buf = mem_.get();
  double best = 0;
  for (int p = 0; p < passes; ++p) {
    // The threads start together on a flag, and the pass is timed from the
    // flag to the last one's end: their creation is not in it.
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    Clock::time_point t0;
    std::vector<std::thread> pool;
    for (int t = 0; t < n; ++t)
      pool.emplace_back([&, t] {
        const size_t begin = count_ * static_cast<size_t>(t) / static_cast<size_t>(n);
        const size_t end = count_ * static_cast<size_t>(t + 1) / static_cast<size_t>(n);
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        sink[static_cast<size_t>(t)] = l.read(buf + begin, end - begin);
        done[static_cast<size_t>(t)] = Clock::now();
      });
    while (ready.load() < n) std::this_thread::yield();
    t0 = Clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(*std::max_element(done.begin(), done.end()) - t0).count();
    best = std::max(best, static_cast<double>(count_ * sizeof(float)) / s * 1e-9);
  }
  if (sink[0] < 0) std::printf(" ");  // keeps the sums alive
  return best;
}

double read_bandwidth_gbs(size_t bytes, int threads, int passes) {
  return ReadProbe(bytes, threads).gbs(passes);
}

double peak_rss_mib() { return status_mib("VmHWM"); }

double rss_mib() { return status_mib("VmRSS"); }

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

size_t last_level_cache_bytes() {
  size_t largest = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream type(dir + "type"), size(dir + "size");
    std::string t, z;
    if (!(type >> t) || !(size >> z) || t == "Instruction" || z.empty()) continue;
    size_t n = 0;
    try {
      n = std::stoull(z);
    } catch (const std::exception&) {
      continue;
    }
    const char unit = z.back();
    n <<= unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0;
    largest = std::max(largest, n);
  }
  return largest;
}

std::string machine_line() { return model::kernel_summary() + " | " + model::thread_summary(); }

}  // namespace troupe::bench
