#pragma once
// A child process (argv, no shell) with its stdout and stderr in a log file:
// signal it, wait for it with a timeout, read its CPU time and memory. The
// destructor kills (SIGKILL) and reaps whatever still runs, so nothing a
// caller started outlives it (tests' servers, `troupe profile --head`'s
// cluster).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/cpu_count.hpp"

namespace troupe::cluster {

using model::pin_calling_thread;

class ChildProcess {
 public:
  // cpus: the CPUs it may run on (sched_setaffinity before exec); empty = those of its parent.
  ChildProcess(const std::vector<std::string>& args, const std::string& log_path, const std::vector<int>& cpus = {})
      : log_path_(log_path) {
    if (args.empty()) throw std::invalid_argument("Process: no command");
    // The child pins itself between fork and exec, where it may not allocate:
    // pin_calling_thread does not below CPU_SETSIZE.
    for (int c : cpus)
      if (c < 0 || c >= CPU_SETSIZE)
        throw std::invalid_argument("Process: CPU " + std::to_string(c) + " cannot be pinned in a child (0-" +
                                    std::to_string(CPU_SETSIZE - 1) + ")");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
      }
      if (!cpus.empty() && !pin_calling_thread(cpus)) _exit(126);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
  }
  ~ChildProcess() {
    if (!status_) {
      kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const { kill(pid_, sig); }

  // The exit status (128 + signal when killed), or nullopt if it still runs
  // after `timeout`.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    if (status_) return status_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      const pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return status_;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  bool running() { return !wait(std::chrono::milliseconds(0)).has_value(); }

  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Resident memory in KiB (VmRSS), 0 when unknown.
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return 0;
  }

  // User + system CPU seconds it has used so far (/proc/PID/stat), -1 when unknown.
  double cpu_seconds() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) return -1;
    std::istringstream fields(stat.substr(paren + 2));
    std::string f;
    long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {  // fields 14 and 15: utime, stime (proc(5))
      if (i == 14) utime = std::stoll(f);
      if (i == 15) stime = std::stoll(f);
    }
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<int> status_;
};

}  // namespace troupe::cluster
