#include "model/cpu_count.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace troupe::model {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// A decimal integer that is the whole token, or nullopt.
std::optional<long long> whole_int(const std::string& token) {
  if (token.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(token.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::invalid_argument malformed(const char* what, const std::string& text) {
  return std::invalid_argument(std::string(what) + ": cannot parse \"" + text + "\"");
}

std::optional<std::string> read_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ROOT/PATH and each ancestor up to ROOT; just ROOT when ROOT/PATH is missing.
std::vector<fs::path> cgroup_chain(const fs::path& root, const std::string& path) {
  std::vector<fs::path> out;
  fs::path rel = fs::path(path).relative_path();
  std::error_code ec;
  if (rel.empty() || !fs::is_directory(root / rel, ec)) return {root};
  for (; !rel.empty(); rel = rel.parent_path()) out.push_back(root / rel);
  out.push_back(root);
  return out;
}

// Keeps the smaller of the quotas seen.
void tighten(CgroupQuota& q, std::optional<double> cpus, const fs::path& file) {
  if (cpus && (q.cpus == 0 || *cpus < q.cpus)) q = {*cpus, file.string()};
}

}  // namespace

std::optional<double> parse_cpu_max(const std::string& text) {
  const auto w = words(text);
  if (w.size() != 2) throw malformed("cpu.max", text);
  const auto period = whole_int(w[1]);
  if (!period || *period <= 0) throw malformed("cpu.max", text);
  if (w[0] == "max") return std::nullopt;
  const auto quota = whole_int(w[0]);
  if (!quota || *quota <= 0) throw malformed("cpu.max", text);
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::optional<double> parse_cfs_quota(const std::string& quota_us, const std::string& period_us) {
  const auto qw = words(quota_us), pw = words(period_us);
  const auto quota = qw.size() == 1 ? whole_int(qw[0]) : std::nullopt;
  const auto period = pw.size() == 1 ? whole_int(pw[0]) : std::nullopt;
  if (!quota || (*quota <= 0 && *quota != -1)) throw malformed("cpu.cfs_quota_us", quota_us);
  if (!period || *period <= 0) throw malformed("cpu.cfs_period_us", period_us);
  if (*quota == -1) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

int cpus_for_quota(double quota) {
  if (!(quota > 1.0)) return 1;
  if (quota > 1 << 20) return 1 << 20;
  return static_cast<int>(std::ceil(quota));
}

CgroupQuota cgroup_cpu_quota(const std::string& cgroup_root, const std::string& proc_self_cgroup) {
  CgroupQuota q;
  const fs::path root(cgroup_root);
  std::istringstream lines(proc_self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    // hierarchy-id:controller-list:path (cgroups(7)); the path may hold ':'.
    const auto c1 = line.find(':');
    const auto c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string path = line.substr(c2 + 1);
    if (id == "0" && controllers.empty()) {  // v2 unified hierarchy
      for (const auto& dir : cgroup_chain(root, path)) {
        const auto text = read_file(dir / "cpu.max");
        if (!text) continue;
        try {
          tighten(q, parse_cpu_max(*text), dir / "cpu.max");
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument((dir / "cpu.max").string() + ": " + e.what());
        }
      }
      continue;
    }
    bool has_cpu = false;
    std::istringstream cs(controllers);
    for (std::string c; std::getline(cs, c, ',');) has_cpu = has_cpu || c == "cpu";
    if (!has_cpu) continue;
    // v1 mounts the controller at ROOT/<controller-list> (Debian, Docker),
    // often with a ROOT/cpu link to it.
    for (const fs::path& mount : {root / controllers, root / "cpu"}) {
      std::error_code ec;
      if (!fs::is_directory(mount, ec)) continue;
      for (const auto& dir : cgroup_chain(mount, path)) {
        const auto quota = read_file(dir / "cpu.cfs_quota_us");
        const auto period = read_file(dir / "cpu.cfs_period_us");
        if (!quota || !period) continue;
        try {
          tighten(q, parse_cfs_quota(*quota, *period), dir / "cpu.cfs_quota_us");
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(dir.string() + ": " + e.what());
        }
      }
      break;
    }
  }
  return q;
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::string t = text;
  t.erase(std::remove_if(t.begin(), t.end(), [](char c) { return c == ' ' || c == '\n' || c == '\t'; }),
          t.end());
  if (t.empty()) return cpus;
  std::istringstream in(t);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t dash = item.find('-');
    const auto lo = whole_int(item.substr(0, dash));
    const auto hi = dash == std::string::npos ? lo : whole_int(item.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi >= (1 << 20)) throw malformed("CPU list", text);
    for (long long c = *lo; c <= *hi; ++c) cpus.push_back(static_cast<int>(c));
  }
  if (t.back() == ',') throw malformed("CPU list", text);
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::vector<int> last_level_cache_cpus(int cpu, const std::string& sysfs_cpu) {
  const fs::path dir = fs::path(sysfs_cpu) / ("cpu" + std::to_string(cpu)) / "cache";
  long long best_level = -1;
  std::vector<int> best;
  for (int i = 0; i < 16; ++i) {
    const fs::path index = dir / ("index" + std::to_string(i));
    const auto level = read_file(index / "level"), type = read_file(index / "type"),
               shared = read_file(index / "shared_cpu_list");
    if (!level || !type || !shared) continue;
    const std::vector<std::string> lw = words(*level), tw = words(*type);
    const auto l = lw.size() == 1 ? whole_int(lw[0]) : std::nullopt;
    if (!l || tw.size() != 1 || tw[0] == "Instruction" || *l <= best_level) continue;
    try {
      best = parse_cpu_list(*shared);
      best_level = *l;
    } catch (const std::invalid_argument&) {
      return {};
    }
  }
  return best;
}

std::vector<int> affinity_cpu_list() {
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) return {};
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    const int rc = sched_getaffinity(0, bytes, set);
    const bool too_small = rc != 0 && errno == EINVAL;
    std::vector<int> cpus;
    if (rc == 0)
      for (int c = 0; c < n; ++c)
        if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
    CPU_FREE(set);
    if (rc == 0 || !too_small) return cpus;
  }
  return {};
}

int affinity_cpus() { return std::max<int>(1, static_cast<int>(affinity_cpu_list().size())); }

CpuCount count_cpus() {
  CpuCount c;
  c.affinity = affinity_cpus();
  try {
    const auto self = read_file("/proc/self/cgroup");
    if (self) {
      const CgroupQuota q = cgroup_cpu_quota("/sys/fs/cgroup", *self);
      c.quota = q.cpus;
      c.quota_file = q.file;
    }
  } catch (const std::exception&) {
    // A malformed kernel file: count the affinity mask alone.
  }
  c.usable = c.quota > 0 ? std::min(c.affinity, cpus_for_quota(c.quota)) : c.affinity;
  return c;
}

int usable_cpus() { return count_cpus().usable; }

bool pin_calling_thread(const std::vector<int>& cpus) {
  int highest = -1;
  for (int c : cpus) {
    if (c < 0) return false;
    highest = std::max(highest, c);
  }
  if (highest < CPU_SETSIZE) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    return sched_setaffinity(0, sizeof set, &set) == 0;
  }
  cpu_set_t* set = CPU_ALLOC(highest + 1);
  if (!set) return false;
  const size_t bytes = CPU_ALLOC_SIZE(highest + 1);
  CPU_ZERO_S(bytes, set);
  for (int c : cpus) CPU_SET_S(c, bytes, set);
  const bool ok = sched_setaffinity(0, bytes, set) == 0;
  CPU_FREE(set);
  return ok;
}

}  // namespace troupe::model
