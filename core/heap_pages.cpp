#include "core/heap_pages.hpp"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/whole_number.hpp"

namespace troupe::core {
namespace {

constexpr const char* kHugetlb = "glibc.malloc.hugetlb";
constexpr const char* kTcacheCount = "glibc.malloc.tcache_count";
constexpr const char* kMimallocLargePages = "MIMALLOC_LARGE_OS_PAGES";

std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::atomic<bool> g_malloc_tuned{false};

// What GLIBC_TUNABLES text `tunables` (name=value pairs separated by ':'; null:
// unset) sets tunable `name` to: its first value ("" when named without one),
// or nullopt when it does not name it.
std::optional<std::string> tunable_setting(const char* tunables, const char* name) {
  std::stringstream ss(tunables == nullptr ? "" : tunables);
  for (std::string item; std::getline(ss, item, ':');) {
    const size_t eq = item.find('=');
    if (item.compare(0, eq, name) == 0) return eq == std::string::npos ? "" : item.substr(eq + 1);
  }
  return std::nullopt;
}

}  // namespace

bool tune_malloc() {
  const char* v = std::getenv("TROUPE_MALLOC");
  if (v != nullptr && std::string(v) == "default") return false;
  if (heap_allocator() != HeapAllocator::kGlibc) return false;  // the thresholds are glibc's malloc's
  // Both calls fail only for out-of-range values; these are in range.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  g_malloc_tuned = mmap_ok && trim_ok;
  return g_malloc_tuned;
}

bool malloc_tuned() { return g_malloc_tuned; }

int64_t HeapTrimPolicy::min_tokens_from(const char* value) {
  if (value == nullptr) return kDefaultMinTokens;
  const std::optional<uint64_t> n = parse_whole_number(value);
  if (!n || *n > INT64_MAX) {
    throw std::invalid_argument(
        "TROUPE_HEAP_TRIM must be a count of tokens (0: never give the heap back), not '" +
        std::string(value) + "'");
  }
  return static_cast<int64_t>(*n);
}

bool release_free_heap() {
#ifdef __GLIBC__
  return malloc_trim(0) == 1;
#else
  return false;
#endif
}

std::optional<std::string> simulator_tunables(const char* current, bool huge_pages) {
  std::string out = current == nullptr ? "" : current;
  const size_t before = out.size();
  const auto add = [&](const char* name, const std::string& value) {
    if (tunable_setting(current, name)) return;  // the user's
    out += (out.empty() ? "" : ":") + std::string(name) + "=" + value;
  };
  if (huge_pages) add(kHugetlb, "1");
  add(kTcacheCount, std::to_string(kSimulatorTcacheCount));
  if (out.size() == before) return std::nullopt;
  return out;
}

bool thp_mode_allows_advice(const std::string& enabled) {
  return enabled.find("[always]") != std::string::npos || enabled.find("[madvise]") != std::string::npos;
}

bool kernel_allows_huge_pages() { return thp_mode_allows_advice(thp_mode()); }

HeapAllocator heap_allocator() {
  // mimalloc's own entry point, found only where its library is loaded; when
  // it is, its malloc is the process's (it is linked or preloaded for that).
  return dlsym(RTLD_DEFAULT, "mi_version") != nullptr ? HeapAllocator::kMimalloc : HeapAllocator::kGlibc;
}

std::optional<std::string> simulator_mimalloc_pages(const char* current, bool huge_pages) {
  if (current != nullptr || !huge_pages) return std::nullopt;
  return "1";
}

bool request_simulator_heap(EnvBefore& previous, HeapAllocator allocator) {
  const char* off = std::getenv("TROUPE_HEAP_THP");
  const bool huge_pages = !(off != nullptr && std::string(off) == "0") && kernel_allows_huge_pages();
  const char* name = allocator == HeapAllocator::kMimalloc ? kMimallocLargePages : "GLIBC_TUNABLES";
  const char* cur = std::getenv(name);
  const std::optional<std::string> next = allocator == HeapAllocator::kMimalloc
                                              ? simulator_mimalloc_pages(cur, huge_pages)
                                              : simulator_tunables(cur, huge_pages);
  if (!next) return false;
  previous = EnvBefore{name, cur == nullptr ? std::nullopt : std::optional<std::string>(cur)};
  return setenv(name, next->c_str(), 1) == 0;
}

void restore_env(const EnvBefore& previous) {
  if (previous.value) {
    setenv(previous.name.c_str(), previous.value->c_str(), 1);
  } else {
    unsetenv(previous.name.c_str());
  }
}

void reexec_with_simulator_heap(char** argv) {
  EnvBefore previous;
  if (!request_simulator_heap(previous)) return;
  execv("/proc/self/exe", argv);
  restore_env(previous);  // exec failed (no /proc?): do not claim otherwise
}

bool heap_huge_pages_requested() {
  const char* pages = std::getenv(kMimallocLargePages);
  const bool asked = heap_allocator() == HeapAllocator::kMimalloc
                         ? pages != nullptr && std::string(pages) == "1"
                         : tunable_setting(std::getenv("GLIBC_TUNABLES"), kHugetlb) == "1";
  return asked && kernel_allows_huge_pages();
}

std::string heap_tcache_count() {
  return tunable_setting(std::getenv("GLIBC_TUNABLES"), kTcacheCount).value_or("");
}

}  // namespace troupe::core
