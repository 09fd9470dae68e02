#pragma once
// The process heap: glibc's thresholds, transparent huge pages, and the
// simulator's allocator.
//
// Transparent huge pages for the heap of a process whose state is many small
// allocations touched a line or two at a time (the simulator: every worker's
// sequences, block tables and prefix-cache names, a few hundred MiB visited
// in turn). With 4 KiB pages nearly each touch is a TLB miss, and in a VM a
// miss is a nested page walk; with 2 MiB pages the same run took 13-27% less
// wall time on Zen 5 (docs/benchmarks.md "The simulator's speed"). glibc (>= 2.35) backs its heap with
// THP when GLIBC_TUNABLES holds glibc.malloc.hugetlb=1, mimalloc when
// MIMALLOC_LARGE_OS_PAGES=1; each reads it only when the process starts, so
// the program re-executes itself once with it set. TROUPE_HEAP_THP=0 turns
// this off; a variable the user already set is left as set. The binaries that
// run the simulator and no model (`troupe`, bench_sim) link mimalloc, which
// ran it 13-29% faster than glibc's malloc on Zen 5 (two threads allocating
// what the other frees; docs/threading.md). Torch-free.
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
// MiB). TROUPE_MALLOC=default leaves glibc's defaults (for measuring); a
// process whose malloc is mimalloc's is left as it is. Returns whether it tuned.
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
// The same for this kernel (its mode read from that file).
bool kernel_allows_huge_pages();

// The allocator behind this process's malloc: mimalloc where its library is
// loaded (the front, `troupe`, and bench_sim link it for the simulator;
// docs/threading.md, "The simulator: two threads, and a heap on huge pages"),
// else glibc's (or a sanitizer's).
enum class HeapAllocator { kGlibc, kMimalloc };
HeapAllocator heap_allocator();

// mimalloc's setting for the simulator's heap: MIMALLOC_LARGE_OS_PAGES=1,
// which mimalloc reads only at start, has it ask for huge pages for its
// segments (on Linux without reserved huge pages: THP through madvise).
// `current` is the variable's value (null: unset). Returns "1" where
// `huge_pages` and the variable is unset, else nullopt (the user's value stays).
std::optional<std::string> simulator_mimalloc_pages(const char* current, bool huge_pages);

// An environment variable as it was before request_simulator_heap set it.
struct EnvBefore {
  std::string name;
  std::optional<std::string> value;  // nullopt: unset
};

// Sets the simulator's heap in the environment, for `allocator`: glibc's
// GLIBC_TUNABLES (huge pages when the kernel allows them and TROUPE_HEAP_THP
// is not 0, and the deeper tcache) or mimalloc's MIMALLOC_LARGE_OS_PAGES (the
// huge pages, on the same conditions); what the user set stays. Returns
// whether it changed the environment (the caller then re-executes);
// `previous` gets the variable as it was, to restore if the re-exec fails.
bool request_simulator_heap(EnvBefore& previous, HeapAllocator allocator = heap_allocator());

// Puts the variable back as request_simulator_heap found it.
void restore_env(const EnvBefore& previous);

// request_simulator_heap, then execv("/proc/self/exe", argv); returns when
// nothing needed changing or the exec failed (the environment restored).
// Call first thing in main, before any thread starts.
void reexec_with_simulator_heap(char** argv);

// Whether this process's heap was asked for huge pages (for reports): its
// allocator's variable (GLIBC_TUNABLES' glibc.malloc.hugetlb=1,
// MIMALLOC_LARGE_OS_PAGES=1) says so and THP is not off.
bool heap_huge_pages_requested();
// The glibc.malloc.tcache_count GLIBC_TUNABLES sets ("": none, glibc's 7;
// glibc's malloc only).
std::string heap_tcache_count();

}  // namespace troupe::core
