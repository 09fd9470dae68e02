#pragma once
// A live `troupe serve --http` on ephemeral ports for black-box tests: started
// with fork/exec, ready when its --ready-file appears, stopped with SIGTERM
// (SIGKILL if it will not stop) when the object dies.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_utils.hpp"

namespace troupe::test {

// A tiny random model made once per test process through the CLI itself.
inline const std::string& tiny_model_dir() {
  static TempDir dir;
  static std::string path = [] {
    const std::string p = dir.file("tiny");
    auto r = run_command(shell_quote(troupe_bin()) + " init-model --preset tiny --positions 512 --seed 7 --out " +
                         shell_quote(p) + " --tokenizer " + shell_quote(tokenizer_dir()));
    if (r.status != 0) throw std::runtime_error("init-model failed: " + r.output);
    return p;
  }();
  return path;
}

class ServeProcess {
 public:
  // `extra`: more flags of troupe serve (e.g. {"--workers", "0"}).
  explicit ServeProcess(const std::vector<std::string>& extra = {}, const std::string& model = tiny_model_dir()) {
    ready_ = dir_.file("ready");
    log_ = dir_.file("serve.log");
    std::vector<std::string> args = {troupe_bin(), "serve",      "--model",  model,      "--listen",
                                     "tcp://127.0.0.1:*",        "--worker-listen",      "tcp://127.0.0.1:*",
                                     "--http",      "127.0.0.1:0", "--ready-file", ready_, "--threads-per-worker",
                                     "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      std::freopen(log_.c_str(), "w", stderr);
      std::freopen("/dev/null", "w", stdout);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // Waits for the ready file (loading a tiny model takes well under a second;
    // the bound is only against a hang).
    for (int i = 0; i < 1200; ++i) {
      std::ifstream in(ready_);
      std::string line;
      while (in && std::getline(in, line)) {
        const size_t eq = line.find('=');
        if (eq != std::string::npos) fields_[line.substr(0, eq)] = line.substr(eq + 1);
      }
      if (fields_.count("http")) return;
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("troupe serve exited early:\n" + log());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("troupe serve did not become ready:\n" + log());
  }
  ~ServeProcess() { stop(); }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  std::string http() const { return fields_.at("http"); }  // HOST:PORT
  std::string url() const { return "http://" + http(); }
  std::string zmq() const { return fields_.at("listen"); }
  std::string log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // SIGTERM, then the exit status (128 + signal if it had to be killed).
  int stop() {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGTERM);
    int st = 0;
    for (int i = 0; i < 600; ++i) {
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return status_ = 128 + SIGKILL;
  }

 private:
  TempDir dir_;
  std::string ready_, log_;
  pid_t pid_ = -1;
  int status_ = -1;
  std::map<std::string, std::string> fields_;
};

}  // namespace troupe::test
