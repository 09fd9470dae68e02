#include "cluster/loadgen/head_profiler.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cluster/client.hpp"
#include "cluster/loadgen/child_process.hpp"
#include "cluster/loadgen/load_generator.hpp"
#include "core/host_info.hpp"
#include "model/cpu_count.hpp"

namespace troupe::cluster {
namespace {

using Clock = std::chrono::steady_clock;

std::string tail(const std::string& text, size_t n = 1500) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

// What the head has served so far, by its status.
struct Served {
  int64_t requests = 0, steps = 0, tokens = 0;
  size_t workers = 0;
};

class Cluster {
 public:
  explicit Cluster(const HeadProfileOptions& o) : o_(o) {
    std::filesystem::create_directories(o.work_dir);
    const std::vector<int> cpus = model::affinity_cpu_list();
    std::vector<int> head_cpus, other_cpus;
    if (o.pin) {
      if (cpus.size() < 2) throw std::invalid_argument("--pin needs 2 CPUs at least (the head's, and the rest)");
      head_cpus = {cpus.back()};
      other_cpus.assign(cpus.begin(), cpus.end() - 1);
      // This thread's CPUs, and so those of every thread it starts from now on (the load generator's).
      if (!pin_calling_thread(other_cpus)) throw std::runtime_error("sched_setaffinity failed");
    }
    const std::string ready = o.work_dir + "/head.ready";
    std::filesystem::remove(ready);
    head_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{o.troupe, "serve", "--model", o.model, "--workers", "0", "--listen",
                                 "tcp://127.0.0.1:*", "--worker-listen", "tcp://127.0.0.1:*", "--ready-file", ready,
                                 "--quiet"},
        o.work_dir + "/head.log", head_cpus);
    std::string to, worker_listen;
    for (const auto until = Clock::now() + std::chrono::seconds(120); to.empty();) {
      std::ifstream in(ready);
      for (std::string line; std::getline(in, line);) {
        if (line.rfind("listen=", 0) == 0) to = line.substr(7);
        if (line.rfind("worker_listen=", 0) == 0) worker_listen = line.substr(14);
      }
      if (!to.empty()) break;
      if (!head_->running() || Clock::now() > until)
        throw std::runtime_error("the head did not start (" + o.work_dir + "/head.log):\n" + tail(head_->log()));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ClientOptions co;
    co.endpoint = to;
    client_ = std::make_unique<Client>(co);
    to_ = to;
    constexpr int32_t kPerNode = 16;
    for (int32_t i = 0; i < o.workers; i += kPerNode) {
      const std::string name = "emulated-" + std::to_string(nodes_.size());
      nodes_.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{o.troupe, "worker", "--join", worker_listen, "--model", o.model, "--name", name,
                                   "--workers", std::to_string(std::min(kPerNode, o.workers - i)), "--emulate",
                                   o.emulate, "--emulate-time-scale", std::to_string(o.time_scale),
                                   "--num-blocks", std::to_string(o.num_blocks)},
          o.work_dir + "/" + name + ".log", other_cpus));
    }
    for (const auto until = Clock::now() + std::chrono::seconds(120);;) {
      if (served().workers >= static_cast<size_t>(o.workers)) break;
      for (auto& n : nodes_)
        if (!n->running()) throw std::runtime_error("an emulated node exited:\n" + tail(n->log()));
      if (!head_->running()) throw std::runtime_error("the head exited:\n" + tail(head_->log()));
      if (Clock::now() > until) throw std::runtime_error("the emulated workers did not all join in 120 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~Cluster() {
    for (auto& n : nodes_) n->signal(SIGTERM);
    for (auto& n : nodes_) n->wait(std::chrono::seconds(20));
    if (head_) {
      head_->signal(SIGTERM);
      head_->wait(std::chrono::seconds(20));
    }
  }

  const std::string& to() const { return to_; }
  double head_cpu_s() const { return head_->cpu_seconds(); }

  Served served() {
    const std::optional<transport::StatusReply> s = client_->status(std::chrono::seconds(10));
    if (!s) throw std::runtime_error("the head did not answer a status request: " + client_->failure());
    Served x;
    x.requests = static_cast<int64_t>(s->requests_served);
    x.workers = s->workers.size();
    for (const auto& w : s->workers) {
      x.steps += static_cast<int64_t>(w.steps);
      x.tokens += static_cast<int64_t>(w.tokens);
    }
    return x;
  }

 private:
  const HeadProfileOptions& o_;
  std::unique_ptr<ChildProcess> head_;
  std::vector<std::unique_ptr<ChildProcess>> nodes_;
  std::unique_ptr<Client> client_;
  std::string to_;
};

LoadResult load(const std::string& to, int32_t n, int32_t in_flight, int32_t input_len, int32_t output_len,
                uint64_t seed) {
  RandomLoadOptions r;
  r.num_requests = n;
  r.input_len = input_len;
  r.output_len = output_len;
  r.range_ratio = 0.5;
  r.seed = seed;
  LoadOptions lo;
  lo.to = to;
  lo.max_concurrency = in_flight;
  LoadResult res = run_load(random_load(r), lo);
  for (const auto& t : res.requests)
    if (!t.success) throw std::runtime_error("a request of the load failed: " + t.error);
  return res;
}

}  // namespace

sim::HeadProfile profile_head(const HeadProfileOptions& o) {
  if (o.troupe.empty() || o.model.empty() || o.emulate.empty())
    throw std::invalid_argument("profile --head: the troupe binary, --model and --emulate are required");
  if (o.workers < 1 || o.workers > 1024) throw std::invalid_argument("--workers must lie in 1..1024");
  if (!(o.time_scale > 0)) throw std::invalid_argument("--emulate-time-scale must be > 0");
  if (!(o.seconds > 0)) throw std::invalid_argument("--seconds must be > 0");
  const auto say = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  // Each run: a mix of requests, steps and tokens that the others do not
  // have (one token a step; many a step; short outputs: many requests a
  // token), then no traffic at all (the idle share).
  struct Mix {
    int32_t in_flight, output_len;
  };
  const int32_t w = o.workers;
  std::vector<Mix> mixes = {{w, 64}, {8 * w, 64}, {8 * w, 4}, {2 * w, 16}, {4 * w, 32}};
  // Lengths drawn up to 1.5x theirs must fit the model's context: shortened if not.
  int32_t input_len = o.input_len;
  if (o.max_model_len > 0) {
    const int32_t room = static_cast<int32_t>((o.max_model_len - 1) / 1.5);
    if (room < 2) throw std::invalid_argument("profile --head: the model's context is too short");
    input_len = std::min(input_len, room / 2);
    for (Mix& m : mixes) m.output_len = std::min(m.output_len, room - input_len);
  }
  Cluster c(o);
  say("head and " + std::to_string(o.workers) + " emulated workers up");
  sim::HeadProfile p;
  p.created = core::utc_now_iso8601();
  p.processor = core::cpu_model_name();
  p.setup = std::to_string(o.workers) + " emulated workers (" + o.emulate + " x " + std::to_string(o.time_scale) +
            "), prompts of " + std::to_string(input_len) + " +-50% token ids over ZeroMQ, " +
            (o.pin ? "the head pinned to a CPU of its own, the nodes and the client on the others"
                   : "the head, the nodes and the client sharing the CPUs");
  uint64_t seed = 1;
  for (const Mix& m : mixes) {
    // A short run first, to size the measured one (and to warm the head).
    const LoadResult pilot = load(c.to(), 2 * m.in_flight, m.in_flight, input_len, m.output_len, seed++);
    const double per_s = static_cast<double>(pilot.requests.size()) / std::max(1e-3, pilot.duration_s);
    const int32_t n = std::max(2 * m.in_flight, static_cast<int32_t>(per_s * o.seconds));
    const Served s0 = c.served();
    const double cpu0 = c.head_cpu_s();
    const auto t0 = Clock::now();
    load(c.to(), n, m.in_flight, input_len, m.output_len, seed++);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu1 = c.head_cpu_s();
    const Served s1 = c.served();
    sim::HeadRun r;
    r.workers = w;
    r.in_flight = m.in_flight;
    r.output_len = m.output_len;
    r.wall_s = wall;
    r.cpu_s = cpu1 - cpu0;
    r.requests = s1.requests - s0.requests;
    r.steps = s1.steps - s0.steps;
    r.tokens = s1.tokens - s0.tokens;
    p.runs.push_back(r);
    say("run: " + std::to_string(m.in_flight) + " in flight, outputs of " + std::to_string(m.output_len) + ": " +
        std::to_string(r.requests) + " requests, " + std::to_string(r.steps) + " steps, " +
        std::to_string(r.tokens) + " tokens in " + std::to_string(wall) + " s; head CPU " + std::to_string(r.cpu_s) +
        " s");
  }
  {
    const double cpu0 = c.head_cpu_s();
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
    sim::HeadRun r;
    r.workers = w;
    r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    r.cpu_s = std::max(1e-3, c.head_cpu_s() - cpu0);  // a clock tick at least: the fit divides by it
    p.runs.push_back(r);
    say("idle: head CPU " + std::to_string(r.cpu_s) + " s in " + std::to_string(r.wall_s) + " s");
  }
  sim::fit(p);
  return p;
}

}  // namespace troupe::cluster
