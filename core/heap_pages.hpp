#pragma once
// The process heap: glibc's thresholds, and transparent huge pages.
//
// Transparent huge pages for the heap of a process whose state is many small
// allocations touched a line or two at a time (the simulator: every worker's
// sequences, block tables and prefix-cache names, a few hundred MiB visited
// in turn). With 4 KiB pages nearly each touch is a TLB miss, and in a VM a
// miss is a nested page walk; with 2 MiB pages the same run took 13-27% less
// wall time on Zen 5 (docs/benchmarks.md "The simulator's speed"). glibc (>= 2.35) backs its heap with
// THP when GLIBC_TUNABLES holds glibc.malloc.hugetlb=1, which it reads only
// when the process starts, so the program re-executes itself once with it
// set. TROUPE_HEAP_THP=0 turns this off; a GLIBC_TUNABLES that already names
// glibc.malloc.hugetlb is left as the user set it. Torch-free.
#include <cstdint>
#include <optional>
#include <string>

namespace troupe::core {

// Keeps glibc from handing freed memory back to the kernel and faulting it in
// again, zeroed, at the next allocation: a forward pass allocates and frees
// the same few MiB-sized tensors every step, and the simulator's vectors grow
// and shrink with the requests; by default glibc serves the larger ones with
// fresh mmaps (and trims the heap top when they are freed), so each round
// pays page faults and the kernel's page zeroing (2 MiB a fault on a heap of
// huge pages; docs/benchmarks.md "Threading policy" has the measurement). Sets M_MMAP_THRESHOLD to
// glibc's largest (32 MiB: the model and the KV pool, larger, still get their
// own mappings) and M_TRIM_THRESHOLD to 1 GiB. The cost: memory freed stays
// in the process for the next use (a forward pass's peak activations, tens of
// MiB). TROUPE_MALLOC=default leaves glibc's defaults (for measuring).
// Returns whether it tuned.
bool tune_malloc();
// Whether tune_malloc() tuned this process.
bool malloc_tuned();

// Hands the free pages of every heap arena back to the kernel (glibc's
// malloc_trim(0)): what tune_malloc keeps for the next step. Not the free top
// of a thread's arena: glibc trims that only in free(), past M_TRIM_THRESHOLD.
// Returns whether any went back (false where the C library is not glibc).
bool release_free_heap();

// When a worker gives its freed activations back (release_free_heap). A
// forward pass holds ~35 KB of activations a token at once (a 900-token
// prefill of GPT-2 124M: ~30 MiB, ~60 MiB of heap with its fragments); the
// heap keeps them, by tune_malloc's choice, so the next step of that size
// pays no page faults. Kept for good after one large prefill, they sit under
// the KV cache's growth and count in the process's peak.
// So: before a step of `tokens`, release when the largest step since the last
// release had at least `min_tokens` (0: never) and this one is at most half of
// it. Runs of large steps keep their memory (they need it again); the step
// after a burst of prompts gives it back, once.
class HeapTrimPolicy {
 public:
  explicit HeapTrimPolicy(int64_t min_tokens = kDefaultMinTokens) : min_tokens_(min_tokens) {}
  static constexpr int64_t kDefaultMinTokens = 256;

  // Call before each step; true: release the free heap before running it.
  bool before_step(int64_t tokens) {
    const bool release = min_tokens_ > 0 && largest_ >= min_tokens_ && 2 * tokens <= largest_;
    if (release) largest_ = 0;
    if (tokens > largest_) largest_ = tokens;
    return release;
  }
  int64_t min_tokens() const { return min_tokens_; }

  // The threshold TROUPE_HEAP_TRIM sets (`value`: its text, null when unset:
  // kDefaultMinTokens): tokens a step, 0 to keep the heap for good. Throws
  // std::invalid_argument naming the variable for anything but a count.
  static int64_t min_tokens_from(const char* value);

 private:
  int64_t min_tokens_;
  int64_t largest_ = 0;  // the largest step since the last release
};

// The simulator's heap (GLIBC_TUNABLES, which glibc reads only at start):
// - glibc.malloc.hugetlb=1 where `huge_pages` (above: THP);
// - glibc.malloc.tcache_count=kSimulatorTcacheCount: each thread keeps that
//   many freed chunks per size (glibc's default 7, for chunks up to 1 KiB) for
//   its next allocations. With two lanes, much of what one thread allocates
//   (a step's events, plans, token lists) is freed by the other; past seven a
//   chunk goes back to its arena under that arena's lock. On Zen 5 bench_sim's
//   hour took a median 7.8% less wall time with 1024 over 15 pairs, the same
//   results byte for byte (docs/benchmarks.md "The simulator's speed"), its
//   peak RSS 1.6-4% more.
// Returns `current` (null or empty: unset) with those of them it does not
// name added, or nullopt when it names both: a tunable the user set is left as
// set.
constexpr int kSimulatorTcacheCount = 1024;
std::optional<std::string> simulator_tunables(const char* current, bool huge_pages);

// Whether the kernel's THP mode (the contents of
// /sys/kernel/mm/transparent_hugepage/enabled, e.g. "always [madvise] never")
// hands out huge pages to memory that asks for them.
bool thp_mode_allows_advice(const std::string& enabled);

// Sets GLIBC_TUNABLES for the simulator's heap: huge pages when the kernel
// allows them and TROUPE_HEAP_THP is not 0, and the deeper tcache; what the
// user set stays. Returns whether it changed the environment (the caller then
// re-executes); `previous` gets the old value (nullopt: it was unset) to
// restore if the re-exec fails.
bool request_simulator_heap(std::optional<std::string>& previous);

// Puts GLIBC_TUNABLES back as request_simulator_heap found it.
void restore_tunables(const std::optional<std::string>& previous);

// request_simulator_heap, then execv("/proc/self/exe", argv); returns when
// nothing needed changing or the exec failed (the environment restored).
// Call first thing in main, before any thread starts.
void reexec_with_simulator_heap(char** argv);

// Whether this process's heap was asked for huge pages (for reports):
// GLIBC_TUNABLES names glibc.malloc.hugetlb=1 and THP is not off.
bool heap_huge_pages_requested();
// The glibc.malloc.tcache_count GLIBC_TUNABLES sets ("": none, glibc's 7).
std::string heap_tcache_count();

}  // namespace troupe::core
