#pragma once
// How many CPUs this process may use, counted the way a container limits
// them: the affinity mask (taskset, cpuset cgroups, docker --cpuset-cpus) and
// the CFS bandwidth quota (docker --cpus, Kubernetes limits.cpu) through
// cgroup v2 `cpu.max` or cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
// Never std::thread::hardware_concurrency(), which counts the host's CPUs: a
// 2-CPU container on a 64-core host would otherwise start 64 threads.
// Torch-free.

#include <optional>
#include <string>
#include <vector>

namespace troupe::model {

struct CpuCount {
  int affinity = 1;        // CPUs in the calling thread's affinity mask; >= 1
  double quota = 0;        // CFS quota / period in CPUs (1.5 = 150 ms per 100 ms); 0 = no quota found
  std::string quota_file;  // the cgroup file that set `quota`; "" when none
  int usable = 1;          // min(affinity, ceil(quota)); >= 1: the threads worth running at once
};

// This process, now. Unreadable or malformed cgroup files count as no quota
// (a CPU count must never stop a server from starting).
CpuCount count_cpus();

// count_cpus().usable.
int usable_cpus();

// CPUs in the calling thread's affinity mask (sched_getaffinity, sized for
// hosts with more than 1024 CPUs); 1 if the call fails.
int affinity_cpus();

// Their numbers, in increasing order; empty if the call fails.
std::vector<int> affinity_cpu_list();

// Puts the calling thread (and the threads it starts from now on, and a
// program it execs) on `cpus`; false when the kernel refuses it (no CPU, none
// of them online) or a CPU number is negative. Allocates nothing when every
// number is below CPU_SETSIZE (1024): safe between fork and exec there.
bool pin_calling_thread(const std::vector<int>& cpus);

// A Linux CPU list ("0-3,8,10-11", sysfs and cpuset style; spaces and a
// trailing newline allowed), sorted and without repeats. Throws
// std::invalid_argument naming the text when malformed.
std::vector<int> parse_cpu_list(const std::string& text);

// The CPUs that share `cpu`'s last-level cache (the highest `level` among its
// data and unified caches under SYSFS/cpuN/cache/index*/: `shared_cpu_list`);
// `sysfs_cpu` is /sys/devices/system/cpu (tests pass a fixture folder). Empty
// when unknown (no such files, or malformed ones).
std::vector<int> last_level_cache_cpus(int cpu, const std::string& sysfs_cpu = "/sys/devices/system/cpu");

// cgroup v2 `cpu.max` text: "QUOTA PERIOD" (microseconds) gives QUOTA/PERIOD
// CPUs; "max PERIOD" gives nullopt (no limit). Throws std::invalid_argument
// naming the text when it is neither.
std::optional<double> parse_cpu_max(const std::string& text);

// cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` texts: quota/period
// CPUs, or nullopt when the quota is -1 (no limit). Throws
// std::invalid_argument naming the text when malformed.
std::optional<double> parse_cfs_quota(const std::string& quota_us, const std::string& period_us);

// Threads worth running under a quota of `quota` CPUs: ceil(quota), >= 1
// (a 1.5-CPU quota still lets two threads make progress).
int cpus_for_quota(double quota);

// The tightest CPU quota on the process's cgroup path and the file it came
// from. `cgroup_root` is where cgroupfs is mounted (/sys/fs/cgroup; tests
// pass a fixture folder); `proc_self_cgroup` is the text of /proc/self/cgroup.
// Reads v2 (`0::PATH` → ROOT/PATH/cpu.max and each ancestor's) and v1 (a
// `N:...cpu...:PATH` line → ROOT/cpu,cpuacct/PATH/cpu.cfs_quota_us, or
// ROOT/cpu/...); a PATH that is not under the mount (a container without its
// own cgroup namespace) falls back to the mount's own files. Throws
// std::invalid_argument naming the file when one is malformed.
struct CgroupQuota {
  double cpus = 0;   // 0 = no quota
  std::string file;  // "" when none
};
CgroupQuota cgroup_cpu_quota(const std::string& cgroup_root, const std::string& proc_self_cgroup);

}  // namespace troupe::model
