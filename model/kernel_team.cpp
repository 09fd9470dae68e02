#include "model/kernel_team.hpp"

#include <ATen/Parallel.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "model/cpu_count.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace troupe::model {
namespace {

// How long an idle helper waits for the next region before it sleeps: long
// enough to carry it across the gaps between one step's regions (LayerNorms,
// the residual adds: microseconds), short enough to give the CPU back between
// steps. sched_yield() after the first kPauseMicros lets a thread that wants
// this CPU (libgomp's team for a torch op, another process) have it.
constexpr int64_t kSpinMicros = 50;
constexpr int64_t kPauseMicros = 4;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

// Spins, then yields, until done() or kSpinMicros have passed; true if done().
template <class Done>
bool spin_until(const Done& done) {
  const int64_t start = now_ns();
  for (uint32_t i = 1;; ++i) {
    if (done()) return true;
    if ((i & 31) != 0) {
      cpu_relax();
      continue;
    }
    const int64_t waited = now_ns() - start;
    if (waited > kSpinMicros * 1000) return false;
    if (waited > kPauseMicros * 1000) sched_yield();
  }
}

std::atomic<int> g_enabled{-1};  // -1: TROUPE_KERNEL_TEAM not read yet
// Bumped in a fork()'s child: a team made before it has no helpers there.
std::atomic<uint64_t> g_fork_generation{0};
std::atomic<uint64_t> g_moves{0};  // kernel_team_moves()
thread_local bool t_inside_chunk = false;
thread_local int t_scope_threads = 0;  // > 0 inside a KernelTeamScope that uses the team: its size

struct ChunkScope {
  bool was = t_inside_chunk;
  ChunkScope() { t_inside_chunk = true; }
  ~ChunkScope() { t_inside_chunk = was; }
};

class KernelTeam {
 public:
  explicit KernelTeam(int size) : size_(size), generation_(g_fork_generation.load()) {
    helpers_->reserve(static_cast<size_t>(size - 1));
    for (int i = 1; i < size; ++i) helpers_->emplace_back([this, i] { helper_loop(i); });
  }

  ~KernelTeam() {
    if (!usable()) {
      // A fork()'s child: the helpers do not exist here, and their joinable
      // std::threads can be neither joined nor destroyed: leaked on purpose.
      (void)helpers_.release();
      return;
    }
    stop_ = true;
    publish();
    for (auto& t : *helpers_) t.join();
  }

  KernelTeam(const KernelTeam&) = delete;
  KernelTeam& operator=(const KernelTeam&) = delete;

  int size() const { return size_; }
  bool usable() const { return generation_ == g_fork_generation.load(std::memory_order_relaxed); }

  // Chunks [begin + i * chunk, ...) for i < tasks, chunk 0 on the caller.
  void run(int64_t begin, int64_t end, int64_t chunk, int tasks, detail::ChunkFn fn, const void* f) {
    caller_cpu_ = sched_getcpu();
    begin_ = begin;
    end_ = end;
    chunk_ = chunk;
    tasks_ = tasks;
    fn_ = fn;
    f_ = f;
    error_ = nullptr;
    failed_.store(false, std::memory_order_relaxed);
    acks_.store(0, std::memory_order_relaxed);
    publish();
    run_chunk(0);
    const int helpers = size_ - 1;
    if (!spin_until([&] { return acks_.load(std::memory_order_acquire) == helpers; }))
      while (acks_.load(std::memory_order_acquire) != helpers) sched_yield();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void publish() {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&epoch_);
  }

  void run_chunk(int i) {
    if (i >= tasks_) return;
    const int64_t b = begin_ + i * chunk_;
    if (b >= end_) return;
    try {
      ChunkScope scope;
      fn_(f_, b, std::min(end_, b + chunk_));
    } catch (...) {
      if (!failed_.exchange(true)) error_ = std::current_exception();
    }
  }

  // A helper woken on its caller's CPU (the scheduler may place it there
  // when the other CPUs are busy for a moment) makes the two take turns on
  // one CPU, and the scheduler may leave them so for the whole step: batch-1
  // int8 steps after a streaming read of two other threads took 9.9-13.0 ms in
  // 8 of 20 steps, against 5-7 ms (2026-12-06, Xeon;
  // docs/notes/2026-12-06-batch1-pages-and-helpers.md). So it
  // moves to another CPU it may use, near the caller where it can
  // (detail::helper_move_targets): its affinity set to those (the kernel
  // moves it at once), then the whole of it again (it stays where it is).
  // `llc`: the last-level caches' CPUs read so far, by CPU (sysfs costs
  // 0.2-0.5 ms a read on these VMs: once per CPU the caller is found on).
  static void move_off(int cpu, const std::vector<int>& allowed,
                       std::unordered_map<int, std::vector<int>>& llc) {
    if (allowed.size() < 2 || std::find(allowed.begin(), allowed.end(), cpu) == allowed.end()) return;
    auto near = llc.find(cpu);
    if (near == llc.end()) near = llc.emplace(cpu, last_level_cache_cpus(cpu)).first;
    const std::vector<int> to = detail::helper_move_targets(cpu, allowed, near->second);
    if (to.empty() || !pin_calling_thread(to)) return;
    g_moves.fetch_add(1, std::memory_order_relaxed);
    pin_calling_thread(allowed);
  }

  void helper_loop(int i) {
    t_inside_chunk = true;  // a kernel that calls back in runs inline here
    const std::vector<int> allowed = affinity_cpu_list();  // the CPUs it may use, as it started
    std::unordered_map<int, std::vector<int>> llc;  // move_off's
    uint32_t seen = 0;  // the epoch at construction: a region published before this thread ran is still seen
    for (;;) {
      if (!spin_until([&] { return epoch_.load(std::memory_order_acquire) != seen; })) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        while (epoch_.load(std::memory_order_seq_cst) == seen) futex_wait(&epoch_, seen);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      }
      seen = epoch_.load(std::memory_order_acquire);
      if (stop_) return;
      if (sched_getcpu() == caller_cpu_) move_off(caller_cpu_, allowed, llc);
      run_chunk(i);
      acks_.fetch_add(1, std::memory_order_release);
    }
  }

  const int size_;
  const uint64_t generation_;
  std::unique_ptr<std::vector<std::thread>> helpers_ = std::make_unique<std::vector<std::thread>>();
  // The region, written by the caller before publish(), read by the helpers
  // after they see the epoch move; not written again until every helper acked.
  int64_t begin_ = 0, end_ = 0, chunk_ = 0;
  int tasks_ = 0;
  detail::ChunkFn fn_ = nullptr;
  const void* f_ = nullptr;
  int caller_cpu_ = -1;  // where the caller published the region
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
  bool stop_ = false;
  alignas(64) std::atomic<uint32_t> epoch_{0};
  std::atomic<int> sleepers_{0};
  alignas(64) std::atomic<int> acks_{0};
};

thread_local std::unique_ptr<KernelTeam> t_team;

void on_fork_child() { g_fork_generation.fetch_add(1); }

KernelTeam& team_of_size(int size) {
  static const bool registered = [] { return pthread_atfork(nullptr, nullptr, on_fork_child) == 0; }();
  (void)registered;
  if (!t_team || t_team->size() != size || !t_team->usable()) {  // !usable: a fork()'s child
    t_team.reset();
    t_team = std::make_unique<KernelTeam>(size);
  }
  return *t_team;
}

}  // namespace

bool kernel_team_enabled() {
  int on = g_enabled.load(std::memory_order_relaxed);
  if (on >= 0) return on == 1;
  const char* v = std::getenv("TROUPE_KERNEL_TEAM");
  const std::string s = v ? v : "1";
  if (s != "0" && s != "1")
    throw std::invalid_argument("TROUPE_KERNEL_TEAM must be 0 (OpenMP regions) or 1 (kernel teams), got '" +
                                s + "'");
  on = s == "1" ? 1 : 0;
  g_enabled.store(on, std::memory_order_relaxed);
  return on == 1;
}

void set_kernel_team_enabled(bool on) { g_enabled.store(on ? 1 : 0, std::memory_order_relaxed); }

uint64_t kernel_team_moves() { return g_moves.load(std::memory_order_relaxed); }

int kernel_team_size() { return t_team && t_team->usable() ? t_team->size() : 0; }

KernelTeamScope::KernelTeamScope(int64_t tokens) {
  if (t_scope_threads > 0 || t_inside_chunk || tokens > kTeamMaxTokens || !kernel_team_enabled()) return;
  if (omp_in_parallel()) return;
  const int threads = at::get_num_threads();
  if (threads <= 1) return;
  team_threads_ = threads;
  omp_threads_ = omp_get_max_threads();
  omp_set_num_threads(1);
  t_scope_threads = threads;
}

KernelTeamScope::~KernelTeamScope() {
  if (team_threads_ == 0) return;
  t_scope_threads = 0;
  omp_set_num_threads(omp_threads_);
}

int kernel_threads() { return t_scope_threads > 0 ? t_scope_threads : at::get_num_threads(); }

namespace detail {

std::vector<int> helper_move_targets(int caller, const std::vector<int>& allowed,
                                     const std::vector<int>& llc) {
  std::vector<int> near, any;
  for (int c : allowed) {
    if (c == caller) continue;
    any.push_back(c);
    if (std::find(llc.begin(), llc.end(), c) != llc.end()) near.push_back(c);
  }
  return near.empty() ? any : near;
}

void kernel_team_run(int64_t begin, int64_t end, int64_t grain, ChunkFn fn, const void* f) {
  if (begin >= end) return;
  if (t_inside_chunk) {  // a kernel called from a chunk of a team's region
    fn(f, begin, end);
    return;
  }
  const int threads = t_scope_threads;
  if (threads == 0) {
    at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { fn(f, b, e); });
    return;
  }
  const int64_t n = end - begin;
  if (n <= grain || n <= 1) {
    fn(f, begin, end);
    return;
  }
  // at::parallel_for's split (ATen/ParallelOpenMP.h, 1.13).
  int64_t tasks = threads;
  if (grain > 0) tasks = std::min<int64_t>(tasks, (n + grain - 1) / grain);
  const int64_t chunk = (n + tasks - 1) / tasks;
  team_of_size(threads).run(begin, end, chunk, static_cast<int>(tasks), fn, f);
}

}  // namespace detail
}  // namespace troupe::model
