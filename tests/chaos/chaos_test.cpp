// The chaos suite: a head, two worker nodes in network namespaces (each a
// host as far as the network goes), and clients; for
// the whole run, faults drawn from a seeded schedule, one at a time:
//
//   kill -9 a node (and start it again)    SIGSTOP / SIGCONT a node
//   a node's link down for 0.5-10 s         a node restarted with failpoints (hangs, lost frames, stalls)
//   hostile clients (oversized frames,      an overload burst past --max-queue
//   garbage, a million stop strings,       HTTP clients: streamed completions beside
//   a reader that stops reading)            slow headers, oversized and malformed requests
//
// At the end: every job a client sent (over ZeroMQ or HTTP) either finished
// exactly once with the tokens (the text, over HTTP) `troupe batch` gives
// (greedy and seeded), or was refused with an explicit `busy` (429); the head's peak RSS stayed under its
// bound; the head and the nodes still serve. The schedule and the seed are printed, so a failure can be
// replayed: TROUPE_CHAOS_SEED=S TROUPE_CHAOS_SECONDS=T chaos_tests. (ctest label `chaos`; needs root for the
// namespaces.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../cluster/cluster_harness.hpp"
#include "../http/raw_http.hpp"

namespace troupe::test {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t env_number(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

// Peak resident memory of a process (VmHWM), KiB; 0 when unknown.
long peak_rss_kib(pid_t pid) {
  return std::max<long>(0, static_cast<long>(proc_kib("/proc/" + std::to_string(pid) + "/status", "VmHWM")));
}

// Failpoints a node may be restarted with: each a way for a worker node to misbehave.
const char* const kNodeFailpoints[] = {
    "worker.step=hang@40",                               // a thread stuck in a step: fenced, node reset
    "node.send_result=drop@4%",                          // results lost on the way: resent
    "node.recv_plan=drop@4%",                            // plans lost on the way: resent
    "worker.step=sleep(1500)@2%",                        // slow steps, under the deadline
    "node.heartbeat=drop@30%;node.send_result=drop@2%",  // a lossy, quiet node
};

// One worker node in its namespace, started again at will.
struct Node {
  Node(const TempDir& dir, const NetNs& ns, std::string name, std::string join)
      : dir(dir), ns(ns), name(std::move(name)), join(std::move(join)) {}
  void start(const std::string& failpoints = "") {
    std::vector<std::string> args = {"ip",
                                     "netns",
                                     "exec",
                                     ns.name,
                                     "env",
                                     "TROUPE_FAILPOINTS=" + failpoints,
                                     bin(),
                                     "worker",
                                     "--join",
                                     join,
                                     "--model",
                                     tiny_model_dir(),
                                     "--num-blocks",
                                     "256",
                                     "--name",
                                     name,
                                     "--join-timeout",
                                     "0"};
    proc = std::make_unique<Process>(args, dir.file(name + "-" + std::to_string(++starts) + ".log"));
  }
  const TempDir& dir;
  const NetNs& ns;
  std::string name, join;
  std::unique_ptr<Process> proc;
  int starts = 0;
};

// A client's jobs: a submit process on a slice of the job file.
struct Wave {
  std::string jobs, out;
  std::unique_ptr<Process> proc;
  size_t n = 0;
};

TEST(Chaos, TheClusterSurvivesASeededScheduleOfFaults) {
  if (getuid() != 0) GTEST_SKIP() << "network namespaces need root; not run";
  const uint64_t seed = env_number("TROUPE_CHAOS_SEED", 20261204);
  const auto run_for = std::chrono::seconds(env_number("TROUPE_CHAOS_SECONDS", 150));
  const long rss_bound_kib = static_cast<long>(env_number("TROUPE_CHAOS_RSS_BOUND_MIB", 1024)) * 1024;
  std::printf("chaos: seed %llu, %lld s (replay: TROUPE_CHAOS_SEED=%llu TROUPE_CHAOS_SECONDS=%lld)\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(run_for.count()),
              static_cast<unsigned long long>(seed), static_cast<long long>(run_for.count()));
  std::fflush(stdout);
  std::mt19937_64 rng(seed);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };

  TempDir dir;
  NetNs ns1(91), ns2(92);
  if (!ns1.ok || !ns2.ok)
    GTEST_SKIP() << "cannot make network namespaces here: " << ns1.why_not << ns2.why_not;

  // Jobs of every kind, and what `troupe batch` makes of them.
  const std::string all_jobs = dir.file("jobs.jsonl");
  write_jobs(all_jobs, 600, 40, static_cast<uint32_t>(seed), 8);
  const auto ref = reference(dir, all_jobs);
  std::vector<std::string> job_lines;
  {
    std::ifstream in(all_jobs);
    for (std::string line; std::getline(in, line);) job_lines.push_back(line);
  }

  // The worker socket on every address (the namespaces reach it through
  // their own links), plaintext: these links are the test's own.
  Head head(dir, "head",
            {"--workers", "0", "--worker-listen", "tcp://0.0.0.0:*", "--insecure", "--max-queue", "48",
             "--http", "127.0.0.1:0", "--http-header-timeout", "3"});
  const std::string port = head.worker_listen.substr(head.worker_listen.rfind(':') + 1);
  Node n1(dir, ns1, "n1", "tcp://" + ns1.host_ip + ":" + port);
  Node n2(dir, ns2, "n2", "tcp://" + ns2.host_ip + ":" + port);
  std::vector<Node*> nodes = {&n1, &n2};
  for (Node* n : nodes) n->start();
  ASSERT_TRUE(head.wait_workers(2)) << head.proc->log() << n1.proc->log() << n2.proc->log();

  std::vector<std::unique_ptr<Wave>> waves;
  size_t next_job = 0;
  auto start_wave = [&](size_t n) {
    auto w = std::make_unique<Wave>();
    w->jobs = dir.file("wave" + std::to_string(waves.size()) + ".jsonl");
    w->out = dir.file("wave" + std::to_string(waves.size()) + ".out.jsonl");
    std::ofstream f(w->jobs);
    for (size_t i = 0; i < n; ++i) f << job_lines[(next_job++) % job_lines.size()] << "\n";
    f.close();
    w->n = n;
    w->proc = start_submit(dir, head, w->jobs, w->out, {"--timeout", "300", "--max-in-flight", "16"});
    waves.push_back(std::move(w));
  };

  // The overload burst and the hostile clients run on threads of their own.
  struct Burst {
    int accepted = 0, busy = 0, finished_once = 0, wrong = 0;
  };
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Burst>> bursts;
  std::map<std::string, int> faults;
  std::ostringstream schedule;
  auto note = [&](double t, const std::string& what) {
    schedule << "  t=" << static_cast<int>(t) << " s: " << what << "\n";
    std::printf("chaos: t=%.1f s: %s\n", t, what.c_str());
    std::fflush(stdout);
  };
  auto burst = [&, listen = head.listen](Burst* b, std::vector<std::pair<int, std::string>> lines) {
    cluster::Client c(cluster::ClientOptions{listen, {}, transport::kDefaultMaxFrameBytes, true, {}});
    std::map<uint64_t, int> finished;
    std::map<uint64_t, std::vector<int32_t>> ids;
    for (size_t i = 0; i < lines.size(); ++i) {
      json j = json::parse(lines[i].second);
      transport::Submit s;
      s.tag = i + 1;
      if (j.contains("prompt")) s.prompt = j["prompt"].get<std::string>();
      if (j.contains("prompt_ids")) s.prompt_ids = j["prompt_ids"].get<std::vector<int32_t>>();
      s.max_tokens = j["max_tokens"];
      s.ignore_eos = true;
      s.temperature = j["temperature"];
      if (j.contains("top_k")) s.top_k = j["top_k"];
      if (j.contains("seed")) s.seed = j["seed"].get<uint64_t>();
      if (j.contains("frequency_penalty")) s.frequency_penalty = j["frequency_penalty"];
      if (j.contains("presence_penalty")) s.presence_penalty = j["presence_penalty"];
      if (j.contains("repetition_penalty")) s.repetition_penalty = j["repetition_penalty"];
      if (j.contains("logit_bias"))
        for (auto& [k, v] : j["logit_bias"].items()) s.logit_bias.emplace_back(std::stoi(k), v.get<float>());
      c.send(s);
    }
    size_t open = lines.size();
    while (open > 0) {
      auto m = c.next(std::chrono::seconds(300));
      if (!m) break;
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, transport::Accepted>) {
              ++b->accepted;
            } else if constexpr (std::is_same_v<T, transport::Rejected>) {
              if (x.code == transport::RejectCode::kBusy)
                ++b->busy;
              else
                ++b->wrong;
              --open;
            } else if constexpr (std::is_same_v<T, transport::Tokens>) {
              ids[x.tag].insert(ids[x.tag].end(), x.ids.begin(), x.ids.end());
            } else if constexpr (std::is_same_v<T, transport::Finished>) {
              if (++finished[x.tag] == 1) --open;
              const int id = lines[x.tag - 1].first;
              if (x.finish_reason == core::FinishReason::kLength &&
                  ids[x.tag] == ref.at(id)["ids"].get<std::vector<int32_t>>() && finished[x.tag] == 1)
                ++b->finished_once;
              else
                ++b->wrong;
            } else {
              ++b->wrong;
            }
          },
          *m);
    }
    b->wrong += static_cast<int>(open);  // jobs never answered
  };
  auto hostile = [listen = head.listen](int kind) {
    cluster::Client c(cluster::ClientOptions{listen, {}, size_t{64} << 20, true, {}});
    if (kind == 0) {  // frames far over the client limit: the connection is dropped unread
      for (int i = 0; i < 5; ++i) c.send_raw(std::string(3u << 20, 'x'));
    } else if (kind == 1) {  // garbage and a million stop strings
      std::mt19937 g(7);
      for (int i = 0; i < 20; ++i) {
        std::string junk(500, '\0');
        for (auto& ch : junk) ch = static_cast<char>(g());
        c.send_raw(junk);
      }
      transport::Submit s;
      s.tag = 1;
      s.prompt = "x";
      s.stop.assign(1'000'000, "");
      for (int i = 0; i < 5; ++i) c.send(s);
    } else {  // a reader that stops reading: streaming jobs, then silence, then gone
      for (uint64_t t = 1; t <= 40; ++t) {
        transport::Submit s;
        s.tag = t;
        s.prompt = "never read";
        s.max_tokens = 100;
        s.ignore_eos = true;
        c.send(s);
      }
      std::this_thread::sleep_for(std::chrono::seconds(20));
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  };

  // HTTP clients: jobs streamed through the HTTP front (each answered with
  // the reference text, or refused 429), and hostile ones beside them.
  struct HttpWave {
    int exact = 0, busy = 0, wrong = 0;
    std::string first_wrong;
  };
  std::vector<std::unique_ptr<HttpWave>> http_waves;
  auto http_wave = [&, endpoint = head.http](HttpWave* w, std::vector<std::string> lines) {
    for (const std::string& line : lines) {
      const json j = json::parse(line);
      json body{{"max_tokens", j["max_tokens"]},
                {"ignore_eos", true},
                {"temperature", j["temperature"]},
                {"stream", true}};
      body["prompt"] = j.contains("prompt") ? j["prompt"] : j["prompt_ids"];
      for (const char* k :
           {"top_k", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias"})
        if (j.contains(k)) body[k] = j[k];
      const int fd = raw::connect_to(endpoint);
      raw::send_all(fd, raw::post("/v1/completions", body.dump()));
      const auto rs = raw::read_responses(fd, 1, std::chrono::seconds(300));
      ::close(fd);
      std::string text, finish;
      if (rs.size() == 1 && rs[0].status == 200) {
        std::istringstream in(rs[0].body);
        for (std::string l; std::getline(in, l);) {
          if (l.rfind("data: {", 0) != 0) continue;
          const json c = json::parse(l.substr(6));
          if (c.contains("error")) finish = "error";
          if (!c.contains("choices") || c["choices"].empty()) continue;
          text += c["choices"][0].value("text", "");
          if (c["choices"][0]["finish_reason"].is_string()) finish = c["choices"][0]["finish_reason"];
        }
      }
      const int id = j["id"].get<int>();
      if (rs.size() == 1 && rs[0].status == 429) {
        ++w->busy;
      } else if (rs.size() == 1 && rs[0].status == 200 && finish == "length" && text == ref.at(id)["text"]) {
        ++w->exact;
      } else {
        if (w->wrong++ == 0)
          w->first_wrong = "job " + std::to_string(id) + ": " + (rs.empty() ? "no answer" : rs[0].body);
      }
    }
  };
  // Slow headers, declared bodies over the limit and malformed requests:
  // each gets its status (408, 413, 400), and nothing else changes.
  std::atomic<int> http_hostile_wrong{0};
  auto http_hostile = [&, endpoint = head.http] {
    std::vector<int> slow;
    for (int i = 0; i < 100; ++i) slow.push_back(raw::connect_to(endpoint));
    const std::string header = "GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    for (int k = 0; k < 6; ++k) {  // a byte a second; the header timeout is 3 s
      for (int fd : slow) ::send(fd, &header[k], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      for (int i = 0; i < 4; ++i) {
        const int fd = raw::connect_to(endpoint);
        raw::send_all(fd,
                      k % 2 ? "NOT HTTP\r\n\r\n"
                            : "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 20971520\r\n\r\n");
        const auto rs = raw::read_responses(fd, 1, std::chrono::seconds(10));
        if (rs.size() != 1 || rs[0].status != (k % 2 ? 400 : 413)) ++http_hostile_wrong;
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    for (int fd : slow) {
      const auto rs = raw::read_responses(fd, 1, std::chrono::seconds(10));
      if (rs.size() != 1 || rs[0].status != 408) ++http_hostile_wrong;
      ::close(fd);
    }
  };

  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  start_wave(40);
  long peak = 0;
  while (Clock::now() - t0 < run_for) {
    // Keep two client waves going.
    size_t running = 0;
    for (auto& w : waves) running += w->proc->running() ? 1 : 0;
    while (running++ < 2) start_wave(30 + rng() % 30);
    Node& node = *nodes[rng() % nodes.size()];
    const int kind = static_cast<int>(rng() % 8);
    if (kind == 0) {
      const double down = uniform(1, 3);
      note(elapsed(), "kill -9 " + node.name + ", restart after " + std::to_string(down).substr(0, 3) + " s");
      node.proc->signal(SIGKILL);
      node.proc->wait(std::chrono::seconds(10));
      std::this_thread::sleep_for(std::chrono::duration<double>(down));
      node.start();
      ++faults["kill -9 and restart"];
    } else if (kind == 1) {
      const double stop = uniform(0.5, 8);
      note(elapsed(), "SIGSTOP " + node.name + " for " + std::to_string(stop).substr(0, 3) + " s");
      node.proc->signal(SIGSTOP);
      std::this_thread::sleep_for(std::chrono::duration<double>(stop));
      node.proc->signal(SIGCONT);
      ++faults["SIGSTOP/SIGCONT"];
    } else if (kind == 2) {
      const double down = uniform(0.5, 10);
      note(elapsed(), "link of " + node.name + " down for " + std::to_string(down).substr(0, 3) + " s");
      run_command("ip link set " + node.ns.host_if + " down");
      std::this_thread::sleep_for(std::chrono::duration<double>(down));
      run_command("ip link set " + node.ns.host_if + " up");
      ++faults["link down"];
    } else if (kind == 3) {
      const std::string fp = kNodeFailpoints[rng() % (sizeof kNodeFailpoints / sizeof *kNodeFailpoints)];
      note(elapsed(), "restart " + node.name + " with failpoints " + fp);
      node.proc->signal(SIGKILL);
      node.proc->wait(std::chrono::seconds(10));
      node.start(fp);
      ++faults["failpoints"];
    } else if (kind == 4) {
      const int h = static_cast<int>(rng() % 3);
      const char* what[] = {"oversized frames", "garbage and a million stop strings",
                            "a reader that stops reading"};
      note(elapsed(), std::string("hostile client: ") + what[h]);
      threads.emplace_back(hostile, h);
      ++faults[std::string("hostile client: ") + what[h]];
    } else if (kind == 5) {
      std::vector<std::pair<int, std::string>> lines;
      for (int i = 0; i < 150; ++i) {
        const size_t k = (next_job++) % job_lines.size();
        lines.emplace_back(json::parse(job_lines[k])["id"].get<int>(), job_lines[k]);
      }
      note(elapsed(), "overload burst: 150 jobs at once (--max-queue 48)");
      bursts.push_back(std::make_unique<Burst>());
      threads.emplace_back(burst, bursts.back().get(), lines);
      ++faults["overload burst"];
    } else if (kind == 6) {
      std::vector<std::string> lines;
      for (int i = 0; i < 16; ++i) lines.push_back(job_lines[(next_job++) % job_lines.size()]);
      note(elapsed(),
           "HTTP clients: 16 streamed completions, beside slow headers, oversized and malformed requests");
      http_waves.push_back(std::make_unique<HttpWave>());
      threads.emplace_back(http_wave, http_waves.back().get(), lines);
      threads.emplace_back(http_hostile);
      ++faults["HTTP clients, hostile ones beside"];
    }
    // Quiet time between faults; the next one comes once this one is over.
    std::this_thread::sleep_for(std::chrono::duration<double>(uniform(2, 6)));
    peak = std::max(peak, peak_rss_kib(head.proc->pid()));
  }
  note(elapsed(), "faults end: every node back, every link up");
  for (Node* n : nodes) {
    run_command("ip link set " + n->ns.host_if + " up");
    n->proc->signal(SIGCONT);
    if (!n->proc->running() || n->proc->log().find("failpoints active") != std::string::npos) {
      n->proc->signal(SIGKILL);
      n->proc->wait(std::chrono::seconds(10));
      n->start();
    }
  }
  for (auto& w : waves) {
    ASSERT_TRUE(w->proc->wait(std::chrono::seconds(600)).has_value())
        << "a client did not finish: " << w->jobs;
  }
  for (auto& t : threads) t.join();
  peak = std::max(peak, peak_rss_kib(head.proc->pid()));

  // Every job of every wave: finished once, with the reference tokens.
  size_t jobs_sent = 0, finished = 0;
  for (auto& w : waves) {
    const auto out = read_jsonl(w->out);
    EXPECT_EQ(out.size(), w->n) << w->out << ": a line for every job";
    std::vector<int> want;
    for (const auto& j : read_jsonl(w->jobs)) want.push_back(j["id"].get<int>());
    for (size_t i = 0; i < out.size() && i < want.size(); ++i) {
      ++jobs_sent;
      EXPECT_EQ(out[i]["id"].get<int>(), want[i]);
      ASSERT_FALSE(out[i].contains("error")) << out[i].dump() << "\n" << schedule.str();
      EXPECT_EQ(out[i]["ids"], ref.at(want[i])["ids"]) << "job " << want[i] << "\n" << schedule.str();
      ++finished;
    }
  }
  int accepted = 0, busy = 0;
  for (const auto& b : bursts) {
    EXPECT_EQ(b->wrong, 0) << "an overload burst's job was answered wrongly, twice or never\n"
                           << schedule.str();
    EXPECT_EQ(b->finished_once, b->accepted) << "every accepted job finishes once";
    jobs_sent += static_cast<size_t>(b->accepted + b->busy);
    finished += static_cast<size_t>(b->finished_once);
    accepted += b->accepted;
    busy += b->busy;
  }
  int http_exact = 0, http_busy = 0;
  for (const auto& w : http_waves) {
    EXPECT_EQ(w->wrong, 0) << "an HTTP job was answered wrongly or not at all: " << w->first_wrong << "\n"
                           << schedule.str();
    jobs_sent += static_cast<size_t>(w->exact + w->busy + w->wrong);
    finished += static_cast<size_t>(w->exact);
    http_exact += w->exact;
    http_busy += w->busy;
    busy += w->busy;
  }
  EXPECT_EQ(http_hostile_wrong, 0) << "a hostile HTTP request did not get its status\n" << schedule.str();
  EXPECT_LT(peak, rss_bound_kib) << "head peak RSS " << peak << " KiB";

  // The head and the nodes still serve.
  auto tail = [](const std::string& log) { return log.size() > 4000 ? log.substr(log.size() - 4000) : log; };
  ASSERT_TRUE(head.wait_workers(2)) << "head:\n"
                                    << tail(head.proc->log()) << "\nn1 (start " << n1.starts << "):\n"
                                    << tail(n1.proc->log()) << "\nn2 (start " << n2.starts << "):\n"
                                    << tail(n2.proc->log()) << "\nschedule:\n"
                                    << schedule.str();
  Wave last;
  last.jobs = dir.file("last.jsonl");
  {
    std::ofstream f(last.jobs);
    for (size_t i = 0; i < 10; ++i) f << job_lines[i] << "\n";
  }
  auto check = start_submit(dir, head, last.jobs, dir.file("last.out.jsonl"));
  ASSERT_EQ(check->wait(std::chrono::seconds(300)), std::optional<int>(0)) << check->log();
  for (const auto& o : read_jsonl(dir.file("last.out.jsonl")))
    EXPECT_EQ(o["ids"], ref.at(o["id"].get<int>())["ids"]);
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_TRUE(head.proc->running());

  std::printf("chaos summary (seed %llu, %.0f s of faults):\n", static_cast<unsigned long long>(seed),
              std::chrono::duration<double>(run_for).count());
  for (const auto& [kind, n] : faults) std::printf("  faults: %-40s %d\n", kind.c_str(), n);
  std::printf(
      "  jobs: %zu sent, %zu finished with the reference tokens, %d refused busy (bursts: %d accepted)\n",
      jobs_sent, finished, busy, accepted);
  std::printf("  HTTP: %d streamed jobs with the reference text, %d refused 429\n", http_exact, http_busy);
  std::printf(
      "  head: workers %llu lost, %llu hung, %llu broken; %llu requests moved, %llu tokens recomputed\n",
      static_cast<unsigned long long>(st->workers_lost), static_cast<unsigned long long>(st->workers_hung),
      static_cast<unsigned long long>(st->workers_broken),
      static_cast<unsigned long long>(st->requests_moved),
      static_cast<unsigned long long>(st->tokens_recomputed));
  std::printf("  head peak RSS: %.0f MiB (bound %.0f MiB)\nschedule:\n%s", peak / 1024.0,
              rss_bound_kib / 1024.0, schedule.str().c_str());
  head.proc->signal(SIGTERM);
  EXPECT_EQ(head.proc->wait(std::chrono::seconds(120)), std::optional<int>(0)) << head.proc->log();
}

}  // namespace
}  // namespace troupe::test
