#pragma once
// Shared test helpers: temp folders, the real tokenizer, a tiny random GPT-2 on
// disk, running the troupe binary, tensor closeness.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::test {

inline std::string tokenizer_dir() { return TROUPE_TOKENIZER_DIR; }

inline std::string troupe_bin() { return TROUPE_BIN; }
// troupe-engine, beside troupe: every command but the clients', which troupe
// execs for them (cli/command_line.hpp). Run it directly where an exec must not
// happen (under an emulator, whose exec would leave it).
inline std::string troupe_engine_bin() {
  const std::string front = TROUPE_BIN;
  return front.substr(0, front.rfind('/') + 1) + "troupe-engine";
}

// Whether freed heap memory is glibc's to hand back (malloc_trim). Under
// AddressSanitizer (scripts/test.sh's second stage) malloc is ASan's, with a
// quarantine: what a test frees stays resident and malloc_trim has nothing.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kGlibcHeap = false;
#else
inline constexpr bool kGlibcHeap = true;
#endif

// The number of a "Field:   N" line of a /proc file ("/proc/thread-self/status",
// "voluntary_ctxt_switches"); -1 when absent.
inline int64_t proc_number(const std::string& file, const std::string& field) {
  std::ifstream in(file);
  const std::string key = field + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  return -1;
}

// A "Field:   N kB" line of a /proc file ("/proc/self/status", "VmHWM"), in
// KiB; -1 when absent. ("/proc/self/smaps_rollup", "Anonymous": exact, from
// the page tables; status's Rss* are per-CPU counters' estimates.)
inline int64_t proc_kib(const std::string& file, const std::string& field) {
  return proc_number(file, field);
}

// This process's anonymous memory, in KiB: exact, from its page tables.
inline int64_t anon_kib() { return proc_kib("/proc/self/smaps_rollup", "Anonymous"); }

// Bytes of [p, p + bytes) resident in memory (mincore: exact, no timing); -1 on error.
inline int64_t resident_bytes(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> in((end - begin) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n * static_cast<int64_t>(page);
}

// Whether this kernel maps pages on MADV_POPULATE_WRITE (Linux >= 5.14).
inline bool kernel_populates() {
#ifdef MADV_POPULATE_WRITE
  const size_t len = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return false;
  const bool ok = madvise(m, len, MADV_POPULATE_WRITE) == 0;
  munmap(m, len);
  return ok;
#else
  return false;
#endif
}

// A fresh folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int status = -1;      // exit code, or 128 + signal
  std::string output;   // stdout (and stderr when merged)
};

// Runs a shell command line, capturing stdout; stderr merged when merge_stderr.
inline CommandResult run_command(const std::string& cmd, bool merge_stderr = true) {
  CommandResult r;
  std::string full = cmd + (merge_stderr ? " 2>&1" : "");
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// Quotes a string for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

}  // namespace troupe::test
