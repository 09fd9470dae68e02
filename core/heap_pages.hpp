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

// GLIBC_TUNABLES with glibc.malloc.hugetlb=1 added to `current` (null or
// empty: unset), or nullopt when `current` already names glibc.malloc.hugetlb.
std::optional<std::string> tunables_with_heap_thp(const char* current);

// Whether the kernel's THP mode (the contents of
// /sys/kernel/mm/transparent_hugepage/enabled, e.g. "always [madvise] never")
// hands out huge pages to memory that asks for them.
bool thp_mode_allows_advice(const std::string& enabled);

// Sets GLIBC_TUNABLES for a THP heap when the kernel allows it, the user has
// not set the tunable and TROUPE_HEAP_THP is not 0. Returns whether it changed
// the environment (the caller then re-executes); `previous` gets the old
// value (nullopt: it was unset) to restore if the re-exec fails.
bool request_heap_huge_pages(std::optional<std::string>& previous);

// Puts GLIBC_TUNABLES back as request_heap_huge_pages found it.
void restore_tunables(const std::optional<std::string>& previous);

// request_heap_huge_pages, then execv("/proc/self/exe", argv); returns when
// nothing needed changing or the exec failed (the environment restored).
// Call first thing in main, before any thread starts.
void reexec_with_heap_huge_pages(char** argv);

// Whether this process's heap was asked for huge pages (for reports):
// GLIBC_TUNABLES names glibc.malloc.hugetlb=1 and THP is not off.
bool heap_huge_pages_requested();

}  // namespace troupe::core
