// The cluster on its bad day, as real processes: faults provoked on purpose
// (failpoints: docs/failpoints.md; SIGSTOP; taken ports; hostile frames) and
// what must hold through each: every job finishes with the tokens `troupe
// batch` gives, once; a stuck worker is noticed and fenced; a lost frame is
// resent, not fatal; client frames cannot starve the workers; a process that
// cannot start says why and exits.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "cluster_harness.hpp"

namespace troupe::test {
namespace {

// argv that runs `troupe ARGS...` with TROUPE_FAILPOINTS set to `spec`.
std::vector<std::string> with_failpoints(const std::string& spec, std::vector<std::string> args) {
  args.insert(args.begin(), {"env", "TROUPE_FAILPOINTS=" + spec});
  return args;
}

// A head started with failpoints (the Head helper runs the binary itself).
struct FailingHead : Head {
  FailingHead(const TempDir& dir, const std::string& name, const std::string& spec,
              std::vector<std::string> extra)
      : Head(dir, name, std::move(extra), {"env", "TROUPE_FAILPOINTS=" + spec}) {}
};

void submit_and_check(const TempDir& dir, const Head& head, const std::string& jobs,
                      const std::map<int, json>& ref, size_t n, const std::string& logs) {
  auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"));
  ASSERT_EQ(submit->wait(seconds(300)), std::optional<int>(0)) << submit->log() << logs;
  expect_same_tokens(ref, read_jsonl(dir.file("out.jsonl")), n);
}

// A local worker whose thread hangs inside its third step (the failpoint
// blocks it, as the ptrace'd thread was in the field): past the step's
// deadline it is fenced, its requests finish on the other worker with the
// reference tokens, and a new worker takes its place. Without deadlines the
// jobs on it waited as long as the thread did, and nothing said so.
TEST(Resilience, ALocalWorkerThatHangsIsFencedAndReplaced) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 24, 24, 11);
  const auto ref = reference(dir, jobs);
  FailingHead head(dir, "head", "worker.step=hang@3",
                   {"--workers", "2", "--step-timeout", "1", "--step-timeout-cold", "1"});
  ASSERT_TRUE(head.wait_workers(2)) << head.proc->log();
  submit_and_check(dir, head, jobs, ref, 24, head.proc->log());
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->workers_hung, 1u);
  EXPECT_GT(st->requests_moved, 0u);
  EXPECT_EQ(st->workers.size(), 2u) << "the hung worker was replaced";
  const std::string log = head.proc->log();
  EXPECT_NE(log.find("failpoint worker.step fired: hang"), std::string::npos) << log;
  EXPECT_NE(log.find(" hung: step "), std::string::npos) << log;
  EXPECT_NE(log.find("restarted as worker 3"), std::string::npos) << log;
  head.proc->signal(SIGTERM);
  EXPECT_EQ(head.proc->wait(seconds(60)), std::optional<int>(0)) << "SIGTERM ends it, hung thread or not";
}

// A node whose worker hangs: fenced by the head's deadline, the node is told
// to reset, starts over with fresh workers and joins again as a new node;
// the jobs finish on the other node with the reference tokens.
TEST(Resilience, ARemoteWorkerThatHangsHasItsNodeResetAndItRejoins) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 24, 24, 12);
  const auto ref = reference(dir, jobs);
  Head head(dir, "head", {"--workers", "0", "--step-timeout", "1", "--step-timeout-cold", "1"});
  Process stuck(
      with_failpoints("worker.step=hang@4", {bin(), "worker", "--join", head.worker_listen, "--model",
                                             tiny_model_dir(), "--num-blocks", "256", "--name", "stuck"}),
      dir.file("stuck.log"));
  auto good = start_worker(dir, head, "good");
  ASSERT_TRUE(head.wait_workers(2)) << head.proc->log();
  submit_and_check(dir, head, jobs, ref, 24, head.proc->log() + stuck.log());
  EXPECT_TRUE(eventually(
      [&] {
        auto st = head.status();
        return st && st->workers_hung == 1 && st->workers.size() == 2;
      },
      seconds(60)))
      << head.proc->log() << stuck.log();
  EXPECT_NE(head.proc->log().find("node 'stuck' is reset"), std::string::npos) << head.proc->log();
  EXPECT_NE(stuck.log().find("the head reset this node"), std::string::npos) << stuck.log();
  // It serves again, as a new worker.
  submit_and_check(dir, head, jobs, ref, 24, head.proc->log());
}

// Frames lost between the head and a node, both ways (results, plans): the
// step sequence numbers show the gap and the frames are sent again. Nothing
// is repeated or lost, the worker is neither declared broken nor lost, and
// the node never starts over. (Before, a lost result made the next one "out
// of order": the worker was dropped as broken and its node shut down.)
TEST(Resilience, LostFramesBetweenHeadAndNodeAreResentNotFatal) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 20, 24, 13);
  const auto ref = reference(dir, jobs);
  FailingHead head(dir, "head", "head.send_plan=drop@7;head.send_plan=drop@30", {"--workers", "0"});
  Process node(with_failpoints("node.send_result=drop@2;node.recv_plan=drop@5;node.send_result=drop@12-13",
                               {bin(), "worker", "--join", head.worker_listen, "--model", tiny_model_dir(),
                                "--num-blocks", "256", "--name", "lossy"}),
               dir.file("lossy.log"));
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log();
  submit_and_check(dir, head, jobs, ref, 20, head.proc->log() + node.log());
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->workers_lost + st->workers_broken + st->workers_hung, 0u) << head.proc->log();
  ASSERT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].id, 1u) << "the same worker throughout";
  for (const char* fp : {"node.send_result fired: drop (hit 2)", "node.recv_plan fired: drop",
                         "node.send_result fired: drop (hit 13)"})
    EXPECT_NE(node.log().find(fp), std::string::npos) << fp << "\n" << node.log();
  EXPECT_NE(head.proc->log().find("head.send_plan fired: drop (hit 7)"), std::string::npos);
  EXPECT_EQ(node.log().find("registering again"), std::string::npos) << node.log();
}

// The head's worker-socket thread stalls twice, each time for half the
// node's liveness window (frames from the node wait unread, the head sends
// nothing meanwhile): no worker is lost or repeated, the node stays a member,
// the jobs finish with the reference tokens.
TEST(Resilience, ADelayedHeadWithinTheLivenessWindowLosesNothing) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 16, 24, 16);
  const auto ref = reference(dir, jobs);
  FailingHead head(dir, "head", "head.recv=delay(1500)@5;head.recv=delay(1500)@20", {"--workers", "0"});
  auto node = start_worker(dir, head, "patient");
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log();
  submit_and_check(dir, head, jobs, ref, 16, head.proc->log() + node->log());
  EXPECT_NE(head.proc->log().find("head.recv fired: delay(1500) (hit 20)"), std::string::npos)
      << head.proc->log();
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->workers_lost + st->workers_hung + st->workers_broken, 0u) << head.proc->log();
  ASSERT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].id, 1u);
  EXPECT_EQ(node->log().find("registering again"), std::string::npos) << node->log();
}

// The thread that reads the clients' socket stalls for longer than a worker
// node's liveness window (the failpoint stands for a flood of client frames
// to decode): the workers' frames are read on a thread of their own, so no
// worker is lost, and the jobs finish once it goes on. (With one thread for
// both sockets, a client's frames held the node's heartbeats back: "worker 1
// lost (no heartbeat)".)
TEST(Resilience, AStalledClientSocketLosesNoWorker) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 10, 16, 14);
  const auto ref = reference(dir, jobs);
  FailingHead head(dir, "head", "head.recv_client=delay(6000)@3",
                   {"--workers", "0", "--heartbeat-ms", "500"});
  auto node = start_worker(dir, head, "steady");
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log();
  submit_and_check(dir, head, jobs, ref, 10, head.proc->log());
  EXPECT_NE(head.proc->log().find("head.recv_client fired: delay"), std::string::npos) << head.proc->log();
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->workers_lost, 0u) << head.proc->log();
  ASSERT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].id, 1u);
  EXPECT_EQ(node->log().find("registering again"), std::string::npos) << node->log();
}

// A hostile client's frames cost the head a glance, not its memory or its
// workers: frames far over the client limit are cut by libzmq before they
// are read; a frame under it holding a million stop strings is refused from
// its array header (the job's tag named); the other clients' jobs finish
// exactly and no worker is lost. (Before, one 15 MB frame of empty stop
// strings stalled the head ~3.5 s and a worker was declared lost.)
TEST(Resilience, HugeClientFramesStallNobody) {
  TempDir dir;
  const std::string jobs = dir.file("jobs.jsonl");
  write_jobs(jobs, 20, 24, 15);
  const auto ref = reference(dir, jobs);
  Head head(dir, "head", {"--workers", "0", "--heartbeat-ms", "500"});
  auto node = start_worker(dir, head, "steady");
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log();
  const long rss_before = head.proc->rss_kib();
  auto submit = start_submit(dir, head, jobs, dir.file("out.jsonl"));
  transport::Submit many_stops;
  many_stops.tag = 77;
  many_stops.prompt = "hi";
  many_stops.stop.assign(1'000'000, "");  // 1 MB of frame: under the 1 MiB limit
  const std::string stops = transport::encode(many_stops);
  ASSERT_LT(stops.size(), size_t{1} << 20);
  {
    cluster::Client hostile(cluster::ClientOptions{head.listen, {}, size_t{64} << 20, true, {}});
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(hostile.send_raw(stops));
    int refused = 0;
    while (refused < 20) {
      auto m = hostile.next(seconds(60));
      ASSERT_TRUE(m) << "no answer to frame " << refused + 1;
      auto* e = std::get_if<transport::Error>(&*m);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->code, transport::ErrorCode::kBadField);
      EXPECT_EQ(e->tag, std::optional<uint64_t>(77));
      EXPECT_NE(e->message.find("at most 16 stop strings, got 1000000"), std::string::npos) << e->message;
      ++refused;
    }
    EXPECT_EQ(refused, 20);
  }
  {
    cluster::Client huge(cluster::ClientOptions{head.listen, {}, size_t{64} << 20, true, {}});
    const std::string body(15u << 20, 'x');
    for (int i = 0; i < 10; ++i) huge.send_raw(body);  // the connection is dropped unread
    std::this_thread::sleep_for(seconds(1));
  }
  ASSERT_EQ(submit->wait(seconds(300)), std::optional<int>(0)) << submit->log() << head.proc->log();
  expect_same_tokens(ref, read_jsonl(dir.file("out.jsonl")), 20);
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->workers_lost, 0u) << head.proc->log();
  EXPECT_EQ(st->workers.size(), 1u);
  const long rss_after = head.proc->rss_kib();
  if (rss_before > 0 && rss_after > 0) {
    EXPECT_LT(rss_after - rss_before, 200 * 1024)
        << "head RSS grew from " << rss_before << " to " << rss_after << " KiB";
  }
}

// A port bound elsewhere: the head says which and exits 1 at once; it no
// longer waits for ever on actors that re-arm their timers (SIGTERM and
// SIGINT were ignored, only SIGKILL ended it).
TEST(Resilience, APortInUseEndsTheHeadWithOneLine) {
  TempDir dir;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string taken = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  for (const bool clients : {true, false}) {
    const std::string free = "tcp://127.0.0.1:*";
    Process head({bin(), "serve", "--model", tiny_model_dir(), "--num-blocks", "64", "--workers", "1",
                  "--listen", clients ? taken : free, "--worker-listen", clients ? free : taken},
                 dir.file(std::string("head-") + (clients ? "clients" : "workers") + ".log"));
    ASSERT_EQ(head.wait(seconds(120)), std::optional<int>(1)) << head.log();
    const std::string log = head.log();
    EXPECT_NE(log.find("cannot bind " + taken + ": Address already in use"), std::string::npos) << log;
  }
  close(fd);
}

// A worker whose head never answers says so at each retry and, at start,
// gives up after --join-timeout with a line naming the address.
TEST(Resilience, AWorkerWithNoHeadSaysSoAndGivesUp) {
  TempDir dir;
  Process node({bin(), "worker", "--join", "tcp://127.0.0.1:9", "--model", tiny_model_dir(), "--num-blocks",
                "16", "--join-timeout", "4", "--name", "lonely"},
               dir.file("lonely.log"));
  ASSERT_EQ(node.wait(seconds(120)), std::optional<int>(1)) << node.log();
  const std::string log = node.log();
  EXPECT_NE(log.find("no answer from the head at tcp://127.0.0.1:9 yet (attempt 2)"), std::string::npos)
      << log;
  EXPECT_NE(log.find("no head answered at tcp://127.0.0.1:9 within 4 s (--join-timeout); giving up"),
            std::string::npos)
      << log;
}

// The batcher actor dies (the failpoint makes it throw, as a broken
// invariant would): the head says so and exits non-zero instead of running
// on with every job hanging and /health saying ok.
TEST(Resilience, AnActorThatDiesTakesTheHeadDown) {
  TempDir dir;
  FailingHead head(dir, "head", "batcher.run=error(invariant broken)@1", {"--workers", "1"});
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log();
  run_command(shell_quote(bin()) + " submit --to " + shell_quote(head.listen) +
              " --prompt Hi --max-tokens 4 --quiet --timeout 5");
  ASSERT_EQ(head.proc->wait(seconds(60)), std::optional<int>(70)) << head.proc->log();
  EXPECT_NE(head.proc->log().find("stopping: the batcher actor died"), std::string::npos) << head.proc->log();
}

// A batcher that does not answer (stalled) turns GET /health to 503 naming
// it, and back to 200 when it answers again.
TEST(Resilience, HealthSays503WhileTheBatcherDoesNotAnswer) {
  if (run_command("command -v curl >/dev/null").status != 0) GTEST_SKIP() << "no curl";
  TempDir dir;
  FailingHead head(dir, "head", "batcher.run=sleep(9000)@1", {"--workers", "1", "--http", "127.0.0.1:0"});
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log();
  std::string http;
  {
    std::ifstream in(dir.file("head.ready"));
    for (std::string line; std::getline(in, line);)
      if (line.rfind("http=", 0) == 0) http = line.substr(5);
  }
  auto health = [&] {
    return run_command("curl -s -m 20 -w ' %{http_code}' http://" + http + "/health", false).output;
  };
  EXPECT_NE(health().find("\"ok\""), std::string::npos);
  // A job: the batcher sleeps 9 s on it.
  Process job({bin(), "submit", "--to", head.listen, "--prompt", "Hi", "--max-tokens", "2", "--quiet"},
              dir.file("job.log"));
  EXPECT_TRUE(eventually([&] { return head.proc->log().find("batcher.run fired") != std::string::npos; },
                         seconds(30)));
  const std::string stalled = health();
  EXPECT_NE(stalled.find("the batcher is not answering"), std::string::npos) << stalled << head.proc->log();
  EXPECT_NE(stalled.find(" 503"), std::string::npos) << stalled;
  EXPECT_TRUE(eventually([&] { return health().find(" 200") != std::string::npos; }, seconds(60)));
}

// A client that stops reading: the head keeps what it owes it, in order, up
// to a bound (--max-client-backlog past what ZeroMQ and TCP hold); past it
// the client is cut: when it reads again it finds every frame up to the cut,
// then a `too_slow` error, and its jobs have ended at the head (their KV
// freed). Nothing is dropped while it still counts as connected. (Before,
// ~2000 frames in, the head dropped its frames one by one, logged "the peer
// is gone" while it was not, and counted its jobs as served: the client got
// neither `finished` nor `error` for any of them.)
TEST(Resilience, ASlowReaderIsCutWithAnErrorItCanSee) {
  TempDir dir;
  Head head(dir, "head", {"--workers", "1", "--max-client-backlog", "100", "--max-queue", "4096"});
  ASSERT_TRUE(head.wait_workers(1)) << head.proc->log();
  zmq::context_t ctx;
  zmq::socket_t client(ctx, zmq::socket_type::dealer);
  client.set(zmq::sockopt::rcvhwm, 10);
  client.set(zmq::sockopt::rcvbuf, 4096);  // the kernel keeps little for it either
  client.set(zmq::sockopt::linger, 0);
  client.set(zmq::sockopt::rcvtimeo, 30000);
  client.connect(head.listen);
  // ~10 MB of replies (each token with its 20 most likely alternatives):
  // more than ZeroMQ's queue and the kernel's buffers hold for a reader.
  const int jobs = 400;
  for (int t = 1; t <= jobs; ++t) {
    transport::Submit s;
    s.tag = static_cast<uint64_t>(t);
    s.prompt = "a slow reader";
    s.max_tokens = 100;
    s.ignore_eos = true;
    s.temperature = 0;
    s.logprobs = 20;
    client.send(zmq::buffer(transport::encode(s)));
  }
  // It reads nothing until the head has cut it off (its jobs ended there).
  ASSERT_TRUE(eventually(
      [&] {
        auto st = head.status();
        return st && st->requests_running == 0 && st->requests_served == static_cast<uint64_t>(jobs);
      },
      seconds(300)))
      << head.proc->log();
  std::map<uint64_t, std::vector<int32_t>> ids;
  std::set<uint64_t> finished;
  std::optional<transport::Error> farewell;
  size_t after_farewell = 0;
  for (;;) {
    zmq::message_t m;
    if (!client.recv(m, zmq::recv_flags::none)) break;
    auto d = transport::decode(m.to_string_view());
    ASSERT_TRUE(d.ok()) << d.error.message;
    if (farewell) {
      ++after_farewell;
      continue;
    }
    if (auto* e = std::get_if<transport::Error>(&*d.message)) {
      farewell = *e;
      client.set(zmq::sockopt::rcvtimeo, 2000);  // what could still follow
    } else if (auto* tk = std::get_if<transport::Tokens>(&*d.message)) {
      ids[tk->tag].insert(ids[tk->tag].end(), tk->ids.begin(), tk->ids.end());
    } else if (auto* f = std::get_if<transport::Finished>(&*d.message)) {
      EXPECT_TRUE(finished.insert(f->tag).second) << "finished twice: " << f->tag;
    }
  }
  ASSERT_TRUE(farewell.has_value()) << "no final error";
  EXPECT_EQ(farewell->code, transport::ErrorCode::kTooSlow) << farewell->message;
  EXPECT_FALSE(farewell->tag.has_value());
  EXPECT_EQ(after_farewell, 0u) << "nothing after the farewell";
  EXPECT_LT(finished.size(), static_cast<size_t>(jobs)) << "the cut came before every job finished";
  // What did arrive is whole: every job's tokens are the same greedy prefix, in order.
  std::vector<int32_t> longest;
  for (const auto& [tag, got] : ids)
    if (got.size() > longest.size()) longest = got;
  for (const auto& [tag, got] : ids) {
    EXPECT_TRUE(std::equal(got.begin(), got.end(), longest.begin()))
        << "job " << tag << ": a gap or a repeat";
    if (finished.count(tag)) {
      EXPECT_EQ(got.size(), 100u) << tag;
    }
  }
  auto st = head.status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].kv_used, 0) << "the cut client's sequences were freed";
}

}  // namespace
}  // namespace troupe::test
