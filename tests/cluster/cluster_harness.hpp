#pragma once
// What the black-box tests of the cluster share: job files of every kind,
// `troupe batch`'s reference outputs, a head, worker nodes and clients as
// real processes on loopback (ephemeral ports), and network namespaces.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cluster/client.hpp"
#include "cluster/sim/cost_profile.hpp"
#include "jsonl.hpp"
#include "process.hpp"
#include "test_utils.hpp"
#include "tiny_model.hpp"
#include "transport/curve_keys.hpp"
#include "transport/protocol.hpp"

namespace troupe::test {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Jobs of every kind: greedy and seeded sampled (explicit seeds, so the
// output does not depend on who drew a seed), text and id prompts, lengths
// forced with ignore_eos, and some with presence or frequency penalties and
// logit biases (whose tokens depend on every token generated before: a
// sequence moved to another worker must take them along).
inline void write_jobs(const std::string& path, int n, int max_tokens, uint32_t seed, int min_tokens = 4) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> len(min_tokens, max_tokens);
  std::ofstream out(path);
  const char* words[] = {"The", "cluster", "serves", "tokens", "quickly", "and", "well", "today"};
  for (int i = 0; i < n; ++i) {
    json j{{"id", i}, {"max_tokens", len(rng)}, {"ignore_eos", true}};
    if (i % 3 == 2) {
      j["prompt_ids"] = {464 + i, 1893, 318 + i % 7};
    } else {
      std::string p;
      for (int w = 0; w < 3 + i % 5; ++w) p += std::string(w ? " " : "") + words[(i + w * 3) % 8];
      j["prompt"] = p;
    }
    if (i % 2 == 0) {
      j["temperature"] = 0;
    } else {
      j["temperature"] = 0.9;
      j["top_k"] = 40;
      j["seed"] = 1000 + i;
    }
    if (i % 4 == 0) j["frequency_penalty"] = 1.0;
    if (i % 8 == 2) j["repetition_penalty"] = 1.5;
    if (i % 4 == 1) {
      j["presence_penalty"] = 1.5;
      j["logit_bias"] = {{"11", 6.0}, {"13", -100}};
    }
    out << j.dump() << "\n";
  }
}

inline std::string bin() { return troupe_bin(); }

// `troupe batch` on the jobs: the reference outputs, by id.
inline std::map<int, json> reference(const TempDir& dir, const std::string& jobs) {
  auto r = run_command(shell_quote(bin()) + " batch --quiet --model " + shell_quote(tiny_model_dir()) +
                       " --input " + shell_quote(jobs) + " --output " +
                       shell_quote(dir.file("reference.jsonl")) + " --num-blocks 512");
  EXPECT_EQ(r.status, 0) << r.output;
  std::map<int, json> ref;
  for (const auto& j : read_jsonl(dir.file("reference.jsonl"))) ref[j["id"].get<int>()] = j;
  return ref;
}

inline void expect_same_tokens(const std::map<int, json>& ref, const std::vector<json>& got, size_t n) {
  ASSERT_EQ(got.size(), n);
  for (const auto& g : got) {
    const int id = g["id"].get<int>();
    ASSERT_FALSE(g.contains("error")) << g.dump();
    ASSERT_TRUE(ref.count(id)) << id;
    EXPECT_EQ(g["ids"], ref.at(id)["ids"]) << "job " << id;
    EXPECT_EQ(g["text"], ref.at(id)["text"]) << "job " << id;
    EXPECT_EQ(g["finish_reason"], "length") << "job " << id;
  }
}

// A head on ephemeral ports; `extra` are more serve flags.
struct Head {
  // `prefix`: words before the binary (an `env` with failpoints).
  Head(const TempDir& dir, const std::string& name, std::vector<std::string> extra,
       std::vector<std::string> prefix = {}) {
    std::vector<std::string> args = prefix;
    args.insert(args.end(), {bin(), "serve", "--model", tiny_model_dir(), "--num-blocks", "256",
                             "--ready-file", dir.file(name + ".ready")});
    for (const char* flag : {"--listen", "--worker-listen"}) {
      if (std::find(extra.begin(), extra.end(), flag) == extra.end())
        args.insert(args.end(), {flag, "tcp://127.0.0.1:*"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    proc = std::make_unique<Process>(args, dir.file(name + ".log"));
    const std::string ready = dir.file(name + ".ready");
    const bool up = eventually([&] { return std::ifstream(ready).good() || !proc->running(); }, seconds(120));
    if (!up || !proc->running()) throw std::runtime_error("the head did not start:\n" + proc->log());
    std::ifstream in(ready);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("listen=", 0) == 0) listen = line.substr(7);
      if (line.rfind("worker_listen=", 0) == 0) worker_listen = line.substr(14);
      if (line.rfind("http=", 0) == 0) http = line.substr(5);
    }
  }
  std::optional<transport::StatusReply> status() const {
    cluster::Client c(
        cluster::ClientOptions{listen, client_keys, transport::kDefaultMaxFrameBytes, true, {}});
    return c.status(seconds(10));
  }
  bool wait_workers(size_t n) const {
    return eventually(
        [&] {
          auto s = status();
          return s && s->workers.size() == n;
        },
        seconds(120));
  }
  std::unique_ptr<Process> proc;
  std::string listen, worker_listen;
  std::string http;                                       // HOST:PORT with --http
  std::optional<transport::CurveClientKeys> client_keys;  // for status() when the head uses CurveZMQ
};

// A made-up cost profile for emulated workers (`troupe worker --emulate`),
// written into `dir`: step times pinned at `knots` tokens; its path.
inline std::string made_up_profile(const TempDir& dir, std::vector<double> knots, std::vector<double> knot_ns,
                                   int32_t n_positions = 0) {
  cluster::sim::CostProfile profile;
  profile.device = "cpu";
  profile.processor = "a test's made-up profile";
  profile.kv_bytes_per_token = 4608;
  if (n_positions > 0) profile.model.n_positions = n_positions;
  profile.cost.knots = std::move(knots);
  profile.cost.knot_ns = std::move(knot_ns);
  const std::string cost = dir.file("cost.json");
  cluster::sim::write_cost_profile(cost, profile);
  return cost;
}

// `prefix`: words before the binary (an `env` with failpoints).
inline std::unique_ptr<Process> start_worker(const TempDir& dir, const Head& head, const std::string& name,
                                             std::vector<std::string> extra = {},
                                             std::vector<std::string> prefix = {}) {
  std::vector<std::string> args = prefix;
  args.insert(args.end(), {bin(), "worker", "--join", head.worker_listen, "--model", tiny_model_dir(),
                           "--num-blocks", "256", "--name", name});
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(args, dir.file(name + ".log"));
}

inline std::unique_ptr<Process> start_submit(const TempDir& dir, const Head& head, const std::string& jobs,
                                             const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {bin(), "submit",   "--to", head.listen, "--input",
                                   jobs,  "--output", out,    "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(args, out + ".log");
}

// A network namespace with its own veth pair: a host as far as the network
// goes. Addresses from the benchmarking range 198.18.0.0/15; traffic stays on
// the pair this test made. Removed (with the pair) when the object dies.
//
// A test that was killed leaves its namespaces and links behind (a machine
// restored from a snapshot keeps them too), with their addresses: a new pair
// on the same /30 would lose its packets to the old route. So the
// constructor first removes what dead test processes left, then takes the
// first /30 from `net` on that no interface of this host uses.
struct NetNs {
  // `net` (0..255): where the search for a free third byte of the addresses starts.
  explicit NetNs(int net) {
    sweep_leftovers();
    const std::string in_use = run_command("ip -o -4 addr show", false).output;
    for (int tries = 0; tries < 256; ++tries, net = (net + 1) % 256) {
      if (in_use.find(" 198.18." + std::to_string(net) + ".") == std::string::npos) break;
    }
    const std::string id = std::to_string(getpid()) + "n" + std::to_string(net);
    name = "troupe-" + id;
    host_if = "tvh" + id;  // at most 3 + 7 + 4 characters: under IFNAMSIZ
    ns_if = "tvn" + id;
    host_ip = "198.18." + std::to_string(net) + ".1";
    ns_ip = "198.18." + std::to_string(net) + ".2";
    const std::string steps[] = {
        "ip netns add " + name,
        "ip link add " + host_if + " type veth peer name " + ns_if,
        "ip link set " + ns_if + " netns " + name,
        "ip addr add " + host_ip + "/30 dev " + host_if,
        "ip link set " + host_if + " up",
        "ip netns exec " + name + " ip addr add " + ns_ip + "/30 dev " + ns_if,
        "ip netns exec " + name + " ip link set " + ns_if + " up",
        "ip netns exec " + name + " ip link set lo up",
    };
    for (const auto& step : steps) {
      auto r = run_command(step);
      if (r.status != 0) {
        why_not = "`" + step + "` failed: " + r.output;
        return;
      }
    }
    ok = true;
  }
  ~NetNs() {
    run_command("ip netns del " + name);
    run_command("ip link del " + host_if);
  }
  NetNs(const NetNs&) = delete;
  NetNs& operator=(const NetNs&) = delete;

  // Namespaces `troupe-<pid>n<net>` and links `tvh<pid>n<net>` whose process is gone.
  static void sweep_leftovers() {
    auto owner_gone = [](const std::string& name, const std::string& prefix) {
      if (name.rfind(prefix, 0) != 0) return false;
      const size_t n = name.find('n', prefix.size());
      if (n == std::string::npos || n == prefix.size()) return false;
      const std::string pid = name.substr(prefix.size(), n - prefix.size());
      if (pid.find_first_not_of("0123456789") != std::string::npos) return false;
      return access(("/proc/" + pid).c_str(), F_OK) != 0;
    };
    std::istringstream namespaces(run_command("ip netns list", false).output);
    for (std::string line; std::getline(namespaces, line);) {
      const std::string ns = line.substr(0, line.find(' '));
      if (owner_gone(ns, "troupe-")) run_command("ip netns del " + ns);
    }
    std::istringstream links(run_command("ls /sys/class/net", false).output);
    for (std::string link; links >> link;) {
      if (owner_gone(link, "tvh")) run_command("ip link del " + link);
    }
  }

  bool ok = false;
  std::string why_not, name, host_if, ns_if, host_ip, ns_ip;
};

}  // namespace troupe::test
