#pragma once
// A live `troupe serve --http` on ephemeral ports for black-box tests, on
// tests/process.hpp: ready when its --ready-file names the HTTP endpoint,
// stopped with SIGTERM (SIGKILL if it will not stop) when the object dies.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "process.hpp"
#include "test_utils.hpp"

namespace troupe::test {

// A tiny random model with 512 positions (tiny_model.hpp's has 128: too few
// for the bench tests' prompts plus outputs), made once per test process
// through the CLI itself.
inline const std::string& tiny_http_model_dir() {
  static TempDir dir;
  static std::string path = [] {
    const std::string p = dir.file("tiny");
    auto r =
        run_command(shell_quote(troupe_bin()) + " init-model --preset tiny --positions 512 --seed 7 --out " +
                    shell_quote(p) + " --tokenizer " + shell_quote(tokenizer_dir()));
    if (r.status != 0) throw std::runtime_error("init-model failed: " + r.output);
    return p;
  }();
  return path;
}

class ServeProcess {
 public:
  // `extra`: more flags of troupe serve (e.g. {"--workers", "0"}).
  explicit ServeProcess(const std::vector<std::string>& extra = {},
                        const std::string& model = tiny_http_model_dir()) {
    const std::string ready = dir_.file("ready");
    std::vector<std::string> args = {troupe_bin(),
                                     "serve",
                                     "--model",
                                     model,
                                     "--listen",
                                     "tcp://127.0.0.1:*",
                                     "--worker-listen",
                                     "tcp://127.0.0.1:*",
                                     "--http",
                                     "127.0.0.1:0",
                                     "--ready-file",
                                     ready,
                                     "--threads-per-worker",
                                     "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    proc_ = std::make_unique<Process>(args, dir_.file("serve.log"));
    // The bound guards against a hang only (a tiny model loads in well under a second).
    const bool up = eventually([&] { return std::ifstream(ready).good() || !proc_->running(); },
                               std::chrono::seconds(120));
    if (!up || !proc_->running()) throw std::runtime_error("troupe serve did not start:\n" + log());
    std::ifstream in(ready);
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) fields_[line.substr(0, eq)] = line.substr(eq + 1);
    }
    if (!fields_.count("http")) throw std::runtime_error("the ready file names no http endpoint:\n" + log());
  }
  ~ServeProcess() { stop(); }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  std::string http() const { return fields_.at("http"); }  // HOST:PORT
  std::string url() const { return "http://" + http(); }
  std::string zmq() const { return fields_.at("listen"); }
  std::string worker_listen() const { return fields_.at("worker_listen"); }
  std::string log() const { return proc_->log(); }
  void signal(int sig) const { proc_->signal(sig); }
  long rss_kib() const { return proc_->rss_kib(); }  // the head's resident memory
  std::optional<int> wait(std::chrono::milliseconds timeout) { return proc_->wait(timeout); }
  // SIGTERM, then the exit status (128 + signal if it had to be killed).
  int stop() {
    if (auto st = proc_->wait(std::chrono::milliseconds(0))) return *st;
    proc_->signal(SIGTERM);
    if (auto st = proc_->wait(std::chrono::seconds(60))) return *st;
    proc_->signal(SIGKILL);
    return proc_->wait(std::chrono::seconds(60)).value_or(128 + SIGKILL);
  }

 private:
  TempDir dir_;
  std::unique_ptr<Process> proc_;
  std::map<std::string, std::string> fields_;
};

}  // namespace troupe::test
