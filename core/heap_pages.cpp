#include "core/heap_pages.hpp"

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

constexpr const char* kTunable = "glibc.malloc.hugetlb";

std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::atomic<bool> g_malloc_tuned{false};

// What GLIBC_TUNABLES text `tunables` (name=value pairs separated by ':'; null:
// unset) sets glibc.malloc.hugetlb to: its first value ("" when named without
// one), or nullopt when it does not name it.
std::optional<std::string> hugetlb_setting(const char* tunables) {
  std::stringstream ss(tunables == nullptr ? "" : tunables);
  for (std::string item; std::getline(ss, item, ':');) {
    const size_t eq = item.find('=');
    if (item.compare(0, eq, kTunable) == 0) return eq == std::string::npos ? "" : item.substr(eq + 1);
  }
  return std::nullopt;
}

}  // namespace

bool tune_malloc() {
  const char* v = std::getenv("TROUPE_MALLOC");
  if (v != nullptr && std::string(v) == "default") return false;
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

std::optional<std::string> tunables_with_heap_thp(const char* current) {
  if (hugetlb_setting(current)) return std::nullopt;
  const std::string cur = current == nullptr ? "" : current;
  const std::string add = std::string(kTunable) + "=1";
  return cur.empty() ? add : cur + ":" + add;
}

bool thp_mode_allows_advice(const std::string& enabled) {
  return enabled.find("[always]") != std::string::npos || enabled.find("[madvise]") != std::string::npos;
}

bool request_heap_huge_pages(std::optional<std::string>& previous) {
  const char* off = std::getenv("TROUPE_HEAP_THP");
  if (off != nullptr && std::string(off) == "0") return false;
  const char* cur = std::getenv("GLIBC_TUNABLES");
  const std::optional<std::string> next = tunables_with_heap_thp(cur);
  if (!next || !thp_mode_allows_advice(thp_mode())) return false;
  previous = cur == nullptr ? std::nullopt : std::optional<std::string>(cur);
  return setenv("GLIBC_TUNABLES", next->c_str(), 1) == 0;
}

void restore_tunables(const std::optional<std::string>& previous) {
  if (previous) {
    setenv("GLIBC_TUNABLES", previous->c_str(), 1);
  } else {
    unsetenv("GLIBC_TUNABLES");
  }
}

void reexec_with_heap_huge_pages(char** argv) {
  std::optional<std::string> previous;
  if (!request_heap_huge_pages(previous)) return;
  execv("/proc/self/exe", argv);
  restore_tunables(previous);  // exec failed (no /proc?): do not claim otherwise
}

bool heap_huge_pages_requested() {
  return hugetlb_setting(std::getenv("GLIBC_TUNABLES")) == "1" && thp_mode_allows_advice(thp_mode());
}

}  // namespace troupe::core
