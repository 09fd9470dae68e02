#pragma once
// KernelTeam: the threads that run one caller's kernels, kept between calls.
//
// A batch-1 decode step of GPT-2 124M runs 61 parallel products and
// attentions of 12-50 us each. Through at::parallel_for each is a libgomp
// parallel region, whose fork and join cost 2.8-3.9 us on a 2-vCPU VM
// (docs/notes/2026-12-05-dot-product-kernels.md, "Later"): ~0.2 ms of a
// ~3 ms int8 step. A KernelTeam hands a region to helper threads that wait
// for it spinning on one cache line, then sleep on a futex when no work came
// for kSpinMicros: a hand-off is a store and a load across cores.
//
// Only small forward passes use it (KernelTeamScope): a pass of at most
// kTeamMaxTokens tokens runs its kernels (LayerNorms included: layer_norm.hpp)
// on the calling thread's team and libtorch's own ops (the embedding, the
// index selects: a few rows) on the calling thread alone,
// so that no libgomp region opens in it (with both pools in one pass, the
// libgomp team woke beside a spinning KernelTeam: a 64-sequence decode step
// was 2-4% slower). A larger pass is left to libgomp: its regions are long,
// and when the limit was chosen one thread's LayerNorms over its rows cost
// what the team saved (a 64-token pass on the team measured 0.98-1.03x of
// libgomp's, a 32-token one 1.00-1.06x, and a server at 32 concurrent
// 1.07-1.26x of the same server with the limit at 16; bench_limits --teams,
// docs/benchmarks.md "Kernel teams"). The LayerNorms have run on the team
// since (layer_norm_rows); measured again then with the limit at 1024,
// libgomp / team: Xeon Emerald Rapids decode 64 0.99-1.02x, prefill 512
// 1.00-1.03x, decode 32 1.00-1.01x; Zen 5 decode 64 0.97-1.02x, prefill 512
// 0.97-1.01x (2026-12-06): nothing gained past 32, so it stays.
//
// kernel_parallel_for(begin, end, grain, f) is at::parallel_for's contract:
// f(b, e) on contiguous chunks that cover [begin, end) once, at most as many
// chunks as kernel_threads(), none shorter than grain but the last; a chunk's
// exception is rethrown on the caller once every chunk has returned. The
// chunking is at::parallel_for's (OpenMP build), so a kernel that splits its
// work by chunk gets the same split either way. Outside a KernelTeamScope it
// is at::parallel_for.
//
// Thread-safety: each calling thread has its own team (thread_local), sized
// by its own at::get_num_threads() when its scope opened, so the workers of
// one process, each with its thread budget (threading.hpp), never share one.
// A call made from inside a chunk runs inline on its thread. A helper that
// finds itself on its caller's CPU when a region comes moves to another of
// the CPUs it may use, one that shares the caller's last-level cache where
// there is one (kernel_team_moves counts it). A child made by
// fork() starts without teams (the helpers are not copied).
// TROUPE_KERNEL_TEAM=0 turns the scopes off (read once; any value other than
// 0 or 1 is refused where it is first read).

#include <cstdint>
#include <vector>

namespace troupe::model {

namespace detail {
// Where a helper found on its caller's CPU `caller` may go: the CPUs of
// `allowed` that share the caller's last-level cache (`llc`; empty when
// unknown) but `caller`, else every CPU of `allowed` but `caller` (the kernel
// would pick among those without regard to distance: on a host of two
// sockets, another socket's). Empty: nowhere.
std::vector<int> helper_move_targets(int caller, const std::vector<int>& allowed,
                                     const std::vector<int>& llc);

using ChunkFn = void (*)(const void* f, int64_t begin, int64_t end);
void kernel_team_run(int64_t begin, int64_t end, int64_t grain, ChunkFn fn, const void* f);
}  // namespace detail

template <class F>
void kernel_parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  detail::kernel_team_run(
      begin, end, grain, [](const void* p, int64_t b, int64_t e) { (*static_cast<const F*>(p))(b, e); }, &f);
}

// The largest forward pass, in tokens, that runs on a KernelTeam.
inline constexpr int64_t kTeamMaxTokens = 32;

// For the life of a forward pass of `tokens` tokens on this thread (above).
// In a scope that uses the team, omp_get_max_threads() is 1 on this thread
// and kernel_threads() the team's size; the destructor restores both. A scope
// inside one that is open changes nothing.
class KernelTeamScope {
 public:
  explicit KernelTeamScope(int64_t tokens);
  ~KernelTeamScope();
  KernelTeamScope(const KernelTeamScope&) = delete;
  KernelTeamScope& operator=(const KernelTeamScope&) = delete;
  bool uses_team() const { return team_threads_ > 0; }

 private:
  int team_threads_ = 0;  // the team's size; 0: this scope changed nothing
  int omp_threads_ = 0;   // this thread's OpenMP team size before the scope
};

// The threads a kernel may split its work over on this thread: the open
// scope's team, else at::get_num_threads().
int kernel_threads();

// Whether scopes use teams (TROUPE_KERNEL_TEAM, default on); throws
// std::invalid_argument for a value other than 0 or 1.
bool kernel_team_enabled();

// For tests and benches: scopes opened from now on use teams (true) or not
// (false), process-wide.
void set_kernel_team_enabled(bool on);

// The calling thread's team size (its helpers + itself); 0 before its first
// region on a team.
int kernel_team_size();

// How many times a helper found itself on its caller's CPU when a region
// came and moved to another CPU of its affinity (process-wide, since start).
uint64_t kernel_team_moves();

}  // namespace troupe::model
