// The distributed system end to end, as real processes on loopback with
// ephemeral ports: `troupe serve` (head), `troupe worker --join` (worker
// nodes), `troupe submit` and `troupe status` (clients). Results are checked
// against `troupe batch` on the same jobs: greedy and seeded sampled outputs
// must be the same tokens whichever worker (or workers, after a kill) ran them.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster/sim/live/emulated_worker.hpp"
#include "cluster/sim/cost_profile.hpp"
#include "cluster_harness.hpp"

namespace troupe::test {
namespace {

TEST(Cluster, HeadAndTwoWorkerProcessesGiveWhatBatchGives) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 50, 24, 1);
  const auto ref = reference(dir, jobs);
  Head head(dir, "head", {"--workers", "0"});
  auto w1 = start_worker(dir, head, "node-a");
  auto w2 = start_worker(dir, head, "node-b");
  ASSERT_TRUE(head.wait_workers(2)) << head.proc->log();
  auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"));
  ASSERT_EQ(submit->wait(seconds(300)), std::optional<int>(0)) << submit->log();
  expect_same_tokens(ref, read_jsonl(dir.file("out.jsonl")), 50);
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->requests_served, 50u);
  ASSERT_EQ(st->workers.size(), 2u);
  int ran_on_both = 0;
  for (const auto& w : st->workers) ran_on_both += w.tokens_per_s > 0 ? 1 : 0;
  EXPECT_EQ(ran_on_both, 2) << "both nodes served jobs";
  // A clean stop: SIGTERM and exit status 0 for every process.
  w1->signal(SIGTERM);
  w2->signal(SIGTERM);
  EXPECT_EQ(w1->wait(seconds(60)), std::optional<int>(0)) << w1->log();
  EXPECT_EQ(w2->wait(seconds(60)), std::optional<int>(0)) << w2->log();
  head.proc->signal(SIGTERM);
  EXPECT_EQ(head.proc->wait(seconds(60)), std::optional<int>(0)) << head.proc->log();
}

TEST(Cluster, KillingAWorkerMidRunLosesAndRepeatsNothing) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 24, 100, 2);
  const auto ref = reference(dir, jobs);
  Head head(dir, "head", {"--workers", "0", "--heartbeat-ms", "200"});
  auto doomed = start_worker(dir, head, "doomed");
  auto survivor = start_worker(dir, head, "survivor");
  ASSERT_TRUE(head.wait_workers(2)) << head.proc->log();
  auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"));
  // Kill -9 the first node once it is running sequences.
  const bool busy = eventually(
      [&] {
        auto s = head.status();
        if (!s) return false;
        for (const auto& w : s->workers)
          if (w.node == "doomed" && w.running > 0) return true;
        return false;
      },
      seconds(120));
  ASSERT_TRUE(busy) << head.proc->log();
  doomed->signal(SIGKILL);
  ASSERT_EQ(submit->wait(seconds(300)), std::optional<int>(0)) << submit->log() << head.proc->log();
  expect_same_tokens(ref, read_jsonl(dir.file("out.jsonl")), 24);
  auto st = head.status();
  ASSERT_TRUE(st);
  ASSERT_EQ(st->workers.size(), 1u) << "the killed node was declared lost";
  EXPECT_EQ(st->workers[0].node, "survivor");
}

// A head that dies and comes back on the same ports gets its node back once.
// The node, having lost the head, sends its register again and again until a
// reply comes; ZeroMQ queues those while the head is away and delivers them
// all when it is back. Each copy gets the same answer: one join, the worker
// id the node was told is the one the head uses, and jobs run.
TEST(Cluster, AHeadRestartedOnItsPortsGetsItsNodeBackOnce) {
  TempDir dir;
  Head first(dir, "head1", {"--workers", "0", "--heartbeat-ms", "100"});
  auto node = start_worker(dir, first, "node-a");
  ASSERT_TRUE(first.wait_workers(1)) << first.proc->log();
  first.proc->signal(SIGKILL);
  ASSERT_TRUE(first.proc->wait(seconds(30)).has_value());
  ASSERT_TRUE(
      eventually([&] { return node->log().find("registering again") != std::string::npos; }, seconds(30)))
      << node->log();
  // Registers go out at once, then 1 s and 3 s later (the node's backoff):
  // let at least two queue.
  std::this_thread::sleep_for(milliseconds(2500));
  Head second(dir, "head2",
              {"--workers", "0", "--heartbeat-ms", "100", "--listen", first.listen, "--worker-listen",
               first.worker_listen});
  ASSERT_TRUE(second.wait_workers(1)) << second.proc->log();
  ASSERT_TRUE(eventually(
      [&] {
        const std::string log = node->log();
        return log.find("registered", log.find("registering again")) != std::string::npos;
      },
      seconds(30)))
      << node->log();
  std::this_thread::sleep_for(milliseconds(500));  // any copy still on its way
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_GE(count(node->log(), "registering again"), 1u);
  EXPECT_EQ(count(second.proc->log(), "node 'node-a' joined"), 1u) << second.proc->log();
  auto st = second.status();
  ASSERT_TRUE(st);
  ASSERT_EQ(st->workers.size(), 1u);
  const std::string told = node->log().substr(node->log().rfind("worker ids ") + 11);
  EXPECT_EQ(std::stoul(told), st->workers[0].id) << node->log();
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 4, 8, 11);
  auto submit = start_submit(dir, second, jobs, dir.file("out.jsonl"));
  ASSERT_EQ(submit->wait(seconds(120)), std::optional<int>(0)) << submit->log() << second.proc->log();
  expect_same_tokens(reference(dir, jobs), read_jsonl(dir.file("out.jsonl")), 4);
}

TEST(Cluster, HostileClientsLeaveTheServerServing) {
  TempDir dir;
  Head head(dir, "head", {"--workers", "1", "--max-client-frame-bytes", "65536"});
  ASSERT_TRUE(head.wait_workers(1));
  {
    cluster::Client c(cluster::ClientOptions{head.listen, {}, 1 << 20, true, {}});
    std::mt19937 rng(3);
    auto answer = [&] { return c.next(seconds(10)); };
    // Garbage of every kind: each is answered with an error, nothing else.
    std::vector<std::pair<std::string, std::string>> garbage;  // (bytes, expected error code)
    std::string random(200, '\0');
    for (auto& ch : random) ch = static_cast<char>(rng());
    garbage.push_back({random, "malformed"});
    transport::Submit s;
    s.tag = 9;
    s.prompt = "cut short";
    const std::string whole = transport::encode(s);
    garbage.push_back({whole.substr(0, whole.size() / 2), "malformed"});
    garbage.push_back({std::string(100000, 'x'), "too_large"});
    // Not a test of every byte: a map with "t": "nonsense" is built by hand.
    garbage.push_back({std::string("\x83\xa1p\xa6troupe\xa1v\x01\xa1t\xa8nonsense", 24), "unknown_type"});
    garbage.push_back({std::string("\x83\xa1p\xa6troupe\xa1v\x09\xa1t\xa6submit", 22), "bad_version"});
    for (const auto& [bytes, code] : garbage) {
      // Through the raw socket: the client's send() takes any body.
      ASSERT_TRUE(c.send_raw(bytes));
      auto m = answer();
      ASSERT_TRUE(m) << "no answer to " << code;
      auto* e = std::get_if<transport::Error>(&*m);
      ASSERT_NE(e, nullptr) << code;
      EXPECT_STREQ(transport::to_string(e->code), code.c_str()) << e->message;
    }
    // A submit with a bad field value is rejected by the router, naming it.
    transport::Submit bad = s;
    bad.temperature = -1;
    ASSERT_TRUE(c.send(bad));
    auto m = answer();
    ASSERT_TRUE(m);
    auto* rej = std::get_if<transport::Rejected>(&*m);
    ASSERT_NE(rej, nullptr);
    EXPECT_EQ(rej->code, transport::RejectCode::kInvalid);
    EXPECT_NE(rej->message.find("temperature"), std::string::npos) << rej->message;
  }
  // A client that vanishes mid-stream: its sequence is cancelled, its KV freed.
  {
    cluster::Client gone(cluster::ClientOptions{head.listen, {}, transport::kDefaultMaxFrameBytes, true, {}});
    transport::Submit s;
    s.tag = 1;
    s.prompt = "A long answer follows";
    s.max_tokens = 120;
    s.ignore_eos = true;
    ASSERT_TRUE(gone.send(s));
    auto first = gone.next(seconds(30));
    ASSERT_TRUE(first && std::holds_alternative<transport::Accepted>(*first));
  }  // the client's socket closes here, mid-stream
  EXPECT_TRUE(eventually(
      [&] {
        auto st = head.status();
        return st && st->requests_running == 0 && st->workers.size() == 1 && st->workers[0].kv_used == 0;
      },
      seconds(120)))
      << "the vanished client's sequence must be cancelled and its KV freed";
  // The server still serves.
  auto r = run_command(shell_quote(bin()) + " submit --to " + shell_quote(head.listen) +
                       " --prompt Hello --max-tokens 5 --temperature 0 --json --quiet");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"completion_tokens\":5"), std::string::npos) << r.output;
  EXPECT_TRUE(head.proc->running());
}

TEST(Cluster, PastMaxQueueJobsAreBusyAtOnceAndAcceptedOnesFinish) {
  TempDir dir;
  Head head(dir, "head", {"--workers", "1", "--max-queue", "4", "--max-num-seqs", "2"});
  ASSERT_TRUE(head.wait_workers(1));
  const long rss_before = head.proc->rss_kib();
  cluster::Client c(cluster::ClientOptions{head.listen, {}, transport::kDefaultMaxFrameBytes, true, {}});
  const int n = 40;  // 10x --max-queue
  for (int i = 1; i <= n; ++i) {
    transport::Submit s;
    s.tag = static_cast<uint64_t>(i);
    s.prompt = "Overload number " + std::to_string(i);
    s.max_tokens = 8;
    s.ignore_eos = true;
    ASSERT_TRUE(c.send(s));
  }
  int accepted = 0, busy = 0, finished = 0;
  while (accepted + busy < n || finished < accepted) {
    auto m = c.next(seconds(60));
    ASSERT_TRUE(m) << "accepted " << accepted << " busy " << busy << " finished " << finished;
    if (std::holds_alternative<transport::Accepted>(*m)) ++accepted;
    if (auto* r = std::get_if<transport::Rejected>(&*m)) {
      EXPECT_EQ(r->code, transport::RejectCode::kBusy) << r->message;
      ++busy;
    }
    if (auto* f = std::get_if<transport::Finished>(&*m)) {
      EXPECT_EQ(f->usage.completion_tokens, 8);
      ++finished;
    }
  }
  EXPECT_GE(busy, n / 2) << "the excess is refused";
  EXPECT_GE(accepted, 4);
  EXPECT_LT(head.proc->rss_kib() - rss_before, 200 * 1024) << "memory stays bounded";
}

// Keys have roles: those of --curve-client-keys may submit, those of
// --curve-worker-keys may join as workers, and a key of one role is refused
// on the other socket. (Before roles, a head that allowed a client's key let
// `troupe worker --curve-secret-key client.key` join and see every prompt.)
TEST(Cluster, CurveKeysHaveRoles) {
  TempDir dir;
  for (const char* name : {"server", "client", "node", "stranger"}) {
    auto r = run_command(shell_quote(bin()) + " keygen --out " + shell_quote(dir.file(name)));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  Head head(dir, "head",
            {"--workers", "0", "--curve-secret-key", dir.file("server.key"), "--curve-client-keys",
             dir.file("client.pub"), "--curve-worker-keys", dir.file("node.pub")});
  const transport::KeyPair client = transport::read_secret_key_file(dir.file("client.key"));
  head.client_keys = transport::CurveClientKeys{client.public_key, client.secret_key,
                                                transport::load_public_key(dir.file("server.pub"))};
  auto worker_with = [&](const char* name, const char* key) {
    return start_worker(dir, head, name,
                        {"--curve-secret-key", dir.file(key), "--curve-server-key", dir.file("server.pub")});
  };
  auto intruder = worker_with("intruder", "client.key");  // a client's key on the worker socket
  auto stranger = worker_with("stranger", "stranger.key");
  auto node = worker_with("member", "node.key");
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log() << node->log();
  auto submit = [&](const char* key) {
    return run_command(shell_quote(bin()) + " submit --to " + shell_quote(head.listen) +
                       " --prompt Hi --max-tokens 3 --json --quiet --timeout 8 --curve-server-key " +
                       shell_quote(dir.file("server.pub")) + " --curve-secret-key " +
                       shell_quote(dir.file(key)));
  };
  auto ok = submit("client.key");
  ASSERT_EQ(ok.status, 0) << ok.output << head.proc->log();
  EXPECT_NE(ok.output.find("\"completion_tokens\":3"), std::string::npos) << ok.output;
  for (const char* key : {"node.key", "stranger.key"}) {  // a worker's key on the client socket, a stranger's
    auto refused = submit(key);
    EXPECT_NE(refused.status, 0) << key << ": " << refused.output;
  }
  // A client without keys is told within moments, not after its --timeout of
  // ten minutes, and the head logs the failed handshake.
  auto keyless = run_command(shell_quote(bin()) + " submit --to " + shell_quote(head.listen) +
                             " --prompt Hi --max-tokens 3 --quiet --timeout 600");
  EXPECT_NE(keyless.status, 0);
  EXPECT_NE(keyless.output.find("handshake with the head at " + head.listen + " failed"), std::string::npos)
      << keyless.output;
  EXPECT_NE(head.proc->log().find("frontend: a client's handshake failed"), std::string::npos);
  std::this_thread::sleep_for(seconds(2));  // the intruders' retries
  auto st = head.status();
  ASSERT_TRUE(st);
  ASSERT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].node, "member");
  const std::string log = head.proc->log();
  EXPECT_NE(log.find("node 'member' joined"), std::string::npos) << log;
  EXPECT_EQ(log.find("node 'intruder' joined"), std::string::npos) << log;
  EXPECT_EQ(log.find("node 'stranger' joined"), std::string::npos) << log;

  // A key in both lists is refused at start; the old flag names clients only, and says so.
  auto both = run_command(shell_quote(bin()) + " serve --model " + shell_quote(tiny_model_dir()) +
                          " --workers 0 --listen tcp://127.0.0.1:* --worker-listen tcp://127.0.0.1:*"
                          " --curve-secret-key " +
                          shell_quote(dir.file("server.key")) + " --curve-client-keys " +
                          shell_quote(dir.file("client.pub")) + " --curve-worker-keys " +
                          shell_quote(dir.file("client.pub")));
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.output.find("a key has one role"), std::string::npos) << both.output;
  Head old(dir, "old",
           {"--workers", "0", "--curve-secret-key", dir.file("server.key"), "--curve-allowed-keys",
            dir.file("client.pub")});
  EXPECT_NE(old.proc->log().find("--curve-allowed-keys is deprecated"), std::string::npos) << old.proc->log();
  auto old_node = start_worker(
      dir, old, "old-node",
      {"--curve-secret-key", dir.file("client.key"), "--curve-server-key", dir.file("server.pub")});
  std::this_thread::sleep_for(seconds(3));
  EXPECT_EQ(old.proc->log().find("joined"), std::string::npos) << old.proc->log();
}

// --devices: one local worker per listed device. Two "cpu" entries make two
// workers that serve like `troupe batch`; a device string torch does not know
// and (on a machine without CUDA) a CUDA device are refused at start with a
// message naming the device. Serving on a real cuda:N needs a GPU machine.
TEST(Cluster, DevicesListMakesOneWorkerPerDevice) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 8, 12, 21);
  const auto ref = reference(dir, jobs);
  {
    Head head(dir, "head", {"--devices", "cpu,cpu"});
    ASSERT_TRUE(head.wait_workers(2));
    const auto st = head.status();
    ASSERT_TRUE(st);
    ASSERT_EQ(st->workers.size(), 2u);
    for (const auto& w : st->workers) EXPECT_EQ(w.device, "cpu");
    auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"));
    ASSERT_EQ(submit->wait(seconds(120)), std::optional<int>(0)) << submit->log();
    expect_same_tokens(ref, read_jsonl(dir.file("out.jsonl")), 8);
  }
  const std::string serve = "timeout 120 " + shell_quote(bin()) + " serve --model " +
                            shell_quote(tiny_model_dir()) +
                            " --listen tcp://127.0.0.1:* --worker-listen tcp://127.0.0.1:* --devices ";
  auto bad = run_command(serve + "tpu:0");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("'tpu:0' is not a torch device"), std::string::npos) << bad.output;
  auto cuda = run_command(serve + "cuda:0");
  EXPECT_NE(cuda.status, 0);  // refused, or (on a GPU machine) still serving when `timeout` stops it
  if (cuda.status != 124) {
    EXPECT_NE(cuda.output.find("device 'cuda:0': this build or machine has no CUDA"), std::string::npos)
        << cuda.output;
  }
}

TEST(Cluster, SigtermFinishesInFlightJobsThenExitsZero) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  // Long jobs (90-100 tokens, ~100 steps), so that some are surely running
  // when the signal comes; the signal waits until the head has accepted all 12.
  write_jobs(jobs, 12, 100, 5, 90);
  const auto ref = reference(dir, jobs);
  Head head(dir, "head", {"--workers", "1"});
  ASSERT_TRUE(head.wait_workers(1));
  auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"));
  ASSERT_TRUE(eventually(
      [&] {
        auto s = head.status();
        return s && s->requests_running >= 1 && s->requests_served + s->requests_running >= 12;
      },
      seconds(120)));
  head.proc->signal(SIGTERM);
  EXPECT_EQ(head.proc->wait(seconds(120)), std::optional<int>(0)) << head.proc->log();
  ASSERT_EQ(submit->wait(seconds(60)), std::optional<int>(0)) << submit->log();
  expect_same_tokens(ref, read_jsonl(dir.file("out.jsonl")), 12);
  // Too late now: a new job finds no head.
  auto r = run_command(shell_quote(bin()) + " submit --to " + shell_quote(head.listen) +
                       " --prompt Hi --max-tokens 2 --quiet --timeout 3");
  EXPECT_NE(r.status, 0);
}

// A head that stops answering (SIGSTOP): after --timeout of silence submit
// writes an error line for every job still open and exits 1.
TEST(Cluster, SubmitGivesEveryOpenJobAnErrorLineWhenTheHeadFallsSilent) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 5, 8, 3);
  Head head(dir, "head", {"--workers", "1"});
  ASSERT_TRUE(head.wait_workers(1));
  head.proc->signal(SIGSTOP);
  auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"), {"--timeout", "2"});
  const auto st = submit->wait(seconds(60));
  head.proc->signal(SIGCONT);
  ASSERT_EQ(st, std::optional<int>(1)) << submit->log();
  const auto out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), 5u) << "a line for every job";
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i]["id"], i);
    EXPECT_EQ(out[i]["error"], "no answer from the head at " + head.listen + " for 2 s") << out[i];
  }
}

TEST(Cluster, AWorkerOnAnotherHostJoinsByIpWithCurve) {
  if (getuid() != 0) GTEST_SKIP() << "network namespaces need root; not run";
  TempDir dir;
  NetNs ns(77);
  if (!ns.ok) GTEST_SKIP() << "cannot make a network namespace here: " << ns.why_not;
  for (const char* name : {"server", "node", "client"}) {
    ASSERT_EQ(run_command(shell_quote(bin()) + " keygen --out " + shell_quote(dir.file(name))).status, 0);
  }
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 10, 16, 9);
  const auto ref = reference(dir, jobs);
  // Without keys the head refuses to bind a non-loopback address.
  auto plain =
      run_command(shell_quote(bin()) + " serve --model " + shell_quote(tiny_model_dir()) +
                  " --workers 0 --listen tcp://127.0.0.1:* --worker-listen tcp://" + ns.host_ip + ":*");
  EXPECT_NE(plain.status, 0);
  EXPECT_NE(plain.output.find("--insecure"), std::string::npos) << plain.output;

  Head head(dir, "head",
            {"--workers", "0", "--worker-listen", "tcp://" + ns.host_ip + ":*", "--curve-secret-key",
             dir.file("server.key"), "--curve-client-keys", dir.file("client.pub"), "--curve-worker-keys",
             dir.file("node.pub")});
  const transport::KeyPair client = transport::read_secret_key_file(dir.file("client.key"));
  head.client_keys = transport::CurveClientKeys{client.public_key, client.secret_key,
                                                transport::load_public_key(dir.file("server.pub"))};
  std::vector<std::string> args = {"ip",
                                   "netns",
                                   "exec",
                                   ns.name,
                                   bin(),
                                   "worker",
                                   "--join",
                                   head.worker_listen,
                                   "--model",
                                   tiny_model_dir(),
                                   "--num-blocks",
                                   "256",
                                   "--name",
                                   "far-away",
                                   "--curve-secret-key",
                                   dir.file("node.key"),
                                   "--curve-server-key",
                                   dir.file("server.pub")};
  Process worker(args, dir.file("far.log"));
  ASSERT_TRUE(head.wait_workers(1)) << worker.log() << head.proc->log();
  auto submit = start_submit(
      dir, head, jobs, dir.file("out.jsonl"),
      {"--curve-server-key", dir.file("server.pub"), "--curve-secret-key", dir.file("client.key")});
  ASSERT_EQ(submit->wait(seconds(300)), std::optional<int>(0)) << submit->log();
  expect_same_tokens(ref, read_jsonl(dir.file("out.jsonl")), 10);
  auto st = head.status();
  ASSERT_TRUE(st);
  ASSERT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].node, "far-away");
}

// `troupe worker --emulate`: no model, the real protocol. Three emulated
// workers in one node join a real head and serve jobs through the real
// router and batcher: every job gets exactly its forced length, of the
// emulated tokens, and each worker spends at least the predicted time per step.
TEST(Cluster, EmulatedWorkersJoinARealHeadAndServeJobs) {
  TempDir dir;
  // 3 ms for a one-token step, 5 ms for 64 tokens
  const std::string cost = made_up_profile(dir, {1, 64}, {3e6, 5e6});

  Head head(dir, "head", {"--workers", "0"});
  auto node = start_worker(dir, head, "emu", {"--workers", "3", "--emulate", cost});
  ASSERT_TRUE(head.wait_workers(3)) << head.proc->log() << node->log();
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 30, 20, 5);
  auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"));
  ASSERT_EQ(submit->wait(seconds(300)), std::optional<int>(0)) << submit->log() << node->log();
  const auto out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), 30u);
  std::map<int, int> want;  // id -> max_tokens
  for (const auto& j : read_jsonl(jobs)) want[j["id"].get<int>()] = j["max_tokens"].get<int>();
  for (const auto& o : out) {
    ASSERT_FALSE(o.contains("error")) << o.dump();
    EXPECT_EQ(o["finish_reason"], "length");
    const auto ids = o["ids"].get<std::vector<int>>();
    EXPECT_EQ(static_cast<int>(ids.size()), want.at(o["id"].get<int>())) << o.dump();
    for (int t : ids) EXPECT_NE(t, 50256) << "an emulated worker never samples eos";
  }
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->requests_served, 30u);
  ASSERT_EQ(st->workers.size(), 3u);
  uint64_t tokens = 0;
  for (const auto& w : st->workers) {
    EXPECT_EQ(w.device, "emulated");
    EXPECT_GT(w.steps, 0u) << "placement spreads the jobs";
    // Each step sleeps at least the predicted 3 ms (a lower bound only).
    EXPECT_GE(w.busy_s, 0.003 * static_cast<double>(w.steps) * 0.99) << w.node;
    tokens += w.tokens;
  }
  uint64_t expected = 0;
  for (const auto& [id, n] : want) expected += static_cast<uint64_t>(n);
  EXPECT_EQ(tokens, expected);
  node->signal(SIGTERM);
  EXPECT_EQ(node->wait(seconds(60)), std::optional<int>(0)) << node->log();
}

// The simulator's fidelity, with the model's cost taken out of the question:
// the worker is emulated with the very cost model the simulator uses, so what
// is compared is the rest — the scheduler, the two steps in flight, the head
// and the wire against their simulation — on the same request list (same
// seed: same arrivals, lengths and forced outputs, same KV capacity). The
// bound is loose (a loaded test machine delays the real head); the tight
// comparison with a real model is bench/bench_fidelity.py's.
TEST(Cluster, SimulateMatchesServeAndBenchWithAnEmulatedWorker) {
  TempDir dir;
  // steps of 20-40 ms: the head's ms are small beside them
  const std::string cost = made_up_profile(dir, {1, 64, 256}, {20e6, 24e6, 40e6}, 128);
  const cluster::sim::CostProfile profile = cluster::sim::read_cost_profile(cost);

  const std::vector<std::string> workload = {
      "--num-requests", "24",  "--request-rate", "6", "--random-input-len", "24", "--random-output-len", "16",
      "--range-ratio",  "0.5", "--seed",         "3"};
  const std::string steps = dir.file("steps.jsonl");
  Head head(dir, "head", {"--workers", "0", "--step-log", steps});
  auto node = start_worker(dir, head, "emu", {"--workers", "1", "--emulate", cost});
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log() << node->log();
  std::string cmd = shell_quote(bin()) + " bench --to " + shell_quote(head.listen) + " --json " +
                    shell_quote(dir.file("real.json"));
  std::string sim = shell_quote(bin()) + " simulate --quiet --cost " + shell_quote(cost) +
                    " --workers 1 --num-blocks 256 --json " + shell_quote(dir.file("sim.json"));
  for (const auto& w : workload) {
    cmd += " " + w;
    sim += " " + w;
  }
  auto r = run_command(cmd);
  ASSERT_EQ(r.status, 0) << r.output;
  auto s = run_command(sim);
  ASSERT_EQ(s.status, 0) << s.output;
  const json real = json::parse(std::ifstream(dir.file("real.json")));
  const json simulated = json::parse(std::ifstream(dir.file("sim.json")));
  EXPECT_EQ(real["completed"], 24);
  EXPECT_EQ(real["total_input_tokens"], simulated["total_input_tokens"]) << "the same request list";
  EXPECT_EQ(real["total_output_tokens"], simulated["total_output_tokens"]) << "the same forced lengths";
  const auto within = [&](const char* key, double tolerance) {
    const double a = real[key].get<double>(), b = simulated[key].get<double>();
    EXPECT_NEAR(b / a, 1.0, tolerance) << key << ": measured " << a << ", simulated " << b;
  };
  within("median_tpot_ms", 0.3);
  within("output_throughput", 0.3);
  within("median_e2el_ms", 0.3);

  // The step log has every step the worker ran, each at least its predicted
  // time (the emulated worker sleeps that long), and calibrating the profile
  // to it changes little (the head's overhead is not in a step).
  auto st = head.status();
  ASSERT_TRUE(st);
  ASSERT_EQ(st->workers.size(), 1u);
  const std::vector<cluster::sim::CostSample> served = cluster::sim::read_step_log(steps);
  EXPECT_EQ(served.size(), st->workers[0].steps);
  int64_t tokens = 0;
  for (const auto& c : served) {
    EXPECT_GE(c.ns, 0.99 * static_cast<double>(profile.cost.predict_ns(c.shape)));
    tokens += c.shape.tokens;
  }
  EXPECT_EQ(tokens,
            real["total_input_tokens"].get<int64_t>() + real["total_output_tokens"].get<int64_t>() - 24)
      << "every prompt token once, every output token but the last fed back once";
  r = run_command(shell_quote(bin()) + " profile --refit " + shell_quote(cost) + " --calibrate-with " +
                  shell_quote(steps) + " --out " + shell_quote(dir.file("calibrated.json")));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("calibrated to " + std::to_string(served.size()) + " served steps"),
            std::string::npos)
      << r.output;
  const cluster::sim::CostProfile calibrated = cluster::sim::read_cost_profile(dir.file("calibrated.json"));
  EXPECT_EQ(calibrated.calibration.steps, served.size());
  EXPECT_LT(calibrated.calibration.after.median_pct, 20);
  for (const auto& c : served) {
    const double p = static_cast<double>(profile.cost.predict_ns(c.shape));
    EXPECT_GE(static_cast<double>(calibrated.cost.predict_ns(c.shape)), 0.9 * p);
    EXPECT_LT(static_cast<double>(calibrated.cost.predict_ns(c.shape)), 1.5 * p);
  }
  node->signal(SIGTERM);
  EXPECT_EQ(node->wait(seconds(60)), std::optional<int>(0)) << node->log();
}

// Prompt logprobs computed by a worker in another process (plans and their
// scores over the wire) equal `troupe batch`'s here; an emulated worker
// answers them too (made-up values) and is charged for their LM-head rows.
TEST(Cluster, ARemoteWorkerScoresPromptsAsTheLocalEngineDoes) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  {
    std::ofstream out(jobs);
    for (int i = 0; i < 8; ++i) {
      json j{{"id", i}, {"temperature", 0}, {"ignore_eos", true}};
      std::string p;
      for (int w = 0; w < 10 + 5 * i; ++w) p += " word" + std::to_string((w * 7 + i) % 23);
      j["prompt"] = p;
      if (i % 2 == 0) {
        j["echo"] = true;
        j["logprobs"] = 1;
        j["max_tokens"] = 0;
      } else {
        j["prompt_logprobs"] = 2;
        j["max_tokens"] = 3;
      }
      out << j.dump() << "\n";
    }
  }
  const auto ref = reference(dir, jobs);
  Head head(dir, "head", {"--workers", "0", "--max-batched-tokens", "32"});
  auto node = start_worker(dir, head, "node-a");
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log();
  auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"));
  ASSERT_EQ(submit->wait(seconds(300)), std::optional<int>(0)) << submit->log() << head.proc->log();
  const auto out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), 8u);
  for (const auto& o : out) {
    const json& r = ref.at(o["id"].get<int>());
    ASSERT_FALSE(o.contains("error")) << o.dump();
    EXPECT_EQ(o["text"], r["text"]);
    EXPECT_EQ(o["ids"], r["ids"]);
    const char* key = o["id"].get<int>() % 2 == 0 ? "logprobs" : "prompt_logprobs";
    ASSERT_EQ(o[key].size(), r[key].size()) << o.dump();
    ASSERT_GE(o[key].size(), 15u);
    for (size_t p = 1; p < r[key].size(); ++p) {
      EXPECT_EQ(o[key][p]["id"], r[key][p]["id"]);
      EXPECT_NEAR(o[key][p]["logprob"].get<double>(), r[key][p]["logprob"].get<double>(), 1e-4) << key << " " << p;
    }
  }
  node->signal(SIGTERM);
  EXPECT_EQ(node->wait(seconds(60)), std::optional<int>(0)) << node->log();

  // An emulated node: the same jobs finish, with made-up prompt logprobs.
  const std::string cost = made_up_profile(dir, {1, 64}, {1e6, 2e6});
  auto emu = start_worker(dir, head, "emu", {"--emulate", cost});
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log() << emu->log();
  auto again = start_submit(dir, head, jobs, dir.file("emu.jsonl"));
  ASSERT_EQ(again->wait(seconds(300)), std::optional<int>(0)) << again->log() << emu->log();
  for (const auto& o : read_jsonl(dir.file("emu.jsonl"))) {
    ASSERT_FALSE(o.contains("error")) << o.dump();
    const char* key = o["id"].get<int>() % 2 == 0 ? "logprobs" : "prompt_logprobs";
    EXPECT_EQ(o[key].size(), ref.at(o["id"].get<int>())[key].size()) << o.dump();
  }
  emu->signal(SIGTERM);
  EXPECT_EQ(emu->wait(seconds(60)), std::optional<int>(0)) << emu->log();
}

// --dtype, --quantization, --kv-cache-dtype: a node whose weights (or KV
// cache) are stored otherwise than the head's is refused (it says why and
// exits) unless the head allows mixed dtypes; a bfloat16 node (bfloat16
// KV: auto) serves a head's jobs as the same model run here.
TEST(Cluster, ANodeOfAnotherDtypeIsRefusedUnlessTheHeadAllowsIt) {
  TempDir dir;
  {
    Head head(dir, "head", {"--workers", "0"});
    auto node = start_worker(dir, head, "bf", {"--dtype", "bfloat16"});
    EXPECT_NE(node->wait(seconds(60)), std::optional<int>(0)) << node->log();
    EXPECT_NE(node->log().find("--dtype bfloat16, the head float32"), std::string::npos) << node->log();
    auto kv = start_worker(dir, head, "kv", {"--kv-cache-dtype", "bfloat16"});
    EXPECT_NE(kv->wait(seconds(60)), std::optional<int>(0)) << kv->log();
    EXPECT_NE(kv->log().find("--kv-cache-dtype bfloat16, the head float32"), std::string::npos) << kv->log();
    auto q8 = start_worker(dir, head, "q8", {"--quantization", "int8"});  // says "int8" at register
    EXPECT_NE(q8->wait(seconds(60)), std::optional<int>(0)) << q8->log();
    EXPECT_NE(q8->log().find("int8, the head float32"), std::string::npos) << q8->log();
  }
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 6, 8, 3);
  auto r = run_command(shell_quote(bin()) + " batch --quiet --dtype bfloat16 --model " + shell_quote(tiny_model_dir()) +
                       " --input " + shell_quote(jobs) + " --output " + shell_quote(dir.file("ref.jsonl")) +
                       " --num-blocks 512");
  ASSERT_EQ(r.status, 0) << r.output;
  std::map<int, json> ref;
  for (const auto& j : read_jsonl(dir.file("ref.jsonl"))) ref[j["id"].get<int>()] = j;
  Head mixed(dir, "mixed", {"--workers", "0", "--allow-mixed-dtypes"});
  auto node = start_worker(dir, mixed, "bf2", {"--dtype", "bfloat16"});
  ASSERT_TRUE(mixed.wait_workers(1)) << mixed.proc->log() << node->log();
  auto submit = start_submit(dir, mixed, jobs, dir.file("out.jsonl"));
  ASSERT_EQ(submit->wait(seconds(300)), std::optional<int>(0)) << submit->log();
  expect_same_tokens(ref, read_jsonl(dir.file("out.jsonl")), 6);
  node->signal(SIGTERM);
  EXPECT_EQ(node->wait(seconds(60)), std::optional<int>(0)) << node->log();
}

TEST(EmulatedWorker, PromptScoresAreAnsweredAndTheirRowsCharged) {
  cluster::EmulatedWorkerConfig config;
  config.cost.knots = {1, 64};
  config.cost.knot_ns = {1e5, 1e5};
  config.cost.sample_ns = 2e6;  // 2 ms per LM-head row: what the scored rows cost
  config.table.num_blocks = 16;
  config.table.block_size = 4;
  config.table.max_positions = 64;
  config.table.vocab_size = 100;
  auto run = [&](int32_t prompt_logprobs) {
    auto runner = cluster::make_emulated_runner(config);
    core::StepPlan plan;
    plan.step_id = 1;
    core::NewSequence ns;
    ns.seq_id = 5;
    ns.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    ns.block_table = {0, 1, 2};
    ns.sampling.prompt_logprobs = prompt_logprobs;
    plan.new_seqs.push_back(ns);
    plan.work.push_back({5, 0, 10, {}, true, 0});
    return runner(plan);
  };
  const core::StepResult scored = run(3), plain = run(-1);
  ASSERT_EQ(scored.prompt_scores.size(), 1u);
  EXPECT_EQ(scored.prompt_scores[0].start, 1);
  ASSERT_EQ(scored.prompt_scores[0].tokens.size(), 9u);
  EXPECT_EQ(scored.prompt_scores[0].tokens[0].id, 2);
  EXPECT_EQ(scored.prompt_scores[0].tokens[0].top.size(), 3u);
  EXPECT_TRUE(plain.prompt_scores.empty());
  ASSERT_EQ(scored.outputs.size(), 1u);
  // Lower bounds only (a step sleeps at least its prediction; a loaded
  // machine only adds): the plain step's one row alone could not reach 20 ms.
  // That the plan's shape counts the scored rows is CostModel.ShapeOfAPlan's.
  EXPECT_GE(scored.forward_ms, 2.0 * 10) << "one sampled row and nine scored ones at 2 ms";
  EXPECT_GE(plain.forward_ms, 2.0) << "one sampled row";
}

TEST(EmulatedWorker, TokensAreDeterministicAndNeverEos) {
  for (uint64_t seq = 1; seq < 50; ++seq) {
    for (int32_t pos = 0; pos < 200; ++pos) {
      const int32_t t = cluster::emulated_token(seq, pos, 7, 3);
      EXPECT_NE(t, 3);
      EXPECT_GE(t, 0);
      EXPECT_LT(t, 7);
      EXPECT_EQ(t, cluster::emulated_token(seq, pos, 7, 3));
    }
  }
  EXPECT_NE(cluster::emulated_token(1, 0, 50257, 50256), cluster::emulated_token(2, 0, 50257, 50256));
}

}  // namespace
}  // namespace troupe::test
