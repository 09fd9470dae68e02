// The load generator's parts: the request list (one generator with the
// simulator, seeded), Server-Sent Events parsing, base URLs, a streaming
// completion's body, and the one-thread client against a local server.
#include "cluster/loadgen/load_generator.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <variant>

#include "cluster/http/http_front.hpp"
#include "cluster/loadgen/openai_client.hpp"
#include "http/listen_backlog.hpp"
#include "process.hpp"
#include "test_utils.hpp"
#include "transport/protocol.hpp"

namespace troupe::cluster {
namespace {

using troupe::test::ListenBacklog;

RandomLoadOptions options(uint64_t seed) {
  RandomLoadOptions o;
  o.num_requests = 50;
  o.request_rate = 4;
  o.burstiness = 0.5;
  o.input_len = 60;
  o.output_len = 128;
  o.range_ratio = 0.1;
  o.seed = seed;
  return o;
}

TEST(LoadGenerator, SameSeedSameRequestsAnotherSeedOthers) {
  const auto a = random_load(options(3)), b = random_load(options(3)), c = random_load(options(4));
  ASSERT_EQ(a.size(), 50u);
  bool any_difference = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_ns, b[i].arrival_ns);
    EXPECT_EQ(a[i].prompt_ids, b[i].prompt_ids);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
    any_difference |= a[i].prompt_ids != c[i].prompt_ids || a[i].arrival_ns != c[i].arrival_ns;
  }
  EXPECT_TRUE(any_difference);
}

TEST(LoadGenerator, LengthsStayInTheRangeAndArrivalsFollowTheRate) {
  const auto a = random_load(options(1));
  EXPECT_EQ(a[0].arrival_ns, 0);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i].prompt_ids.size(), 54u);
    EXPECT_LE(a[i].prompt_ids.size(), 66u);
    EXPECT_EQ(a[i].prompt_tokens, static_cast<int32_t>(a[i].prompt_ids.size()));
    EXPECT_GE(a[i].max_tokens, 115);
    EXPECT_LE(a[i].max_tokens, 140);
    for (int32_t id : a[i].prompt_ids) {
      EXPECT_TRUE(id >= 0 && id < 50257);
    }
    if (i > 0) {
      EXPECT_GE(a[i].arrival_ns, a[i - 1].arrival_ns);
    }
  }
  // 49 gaps of mean 1/4 s: the mean gap of this draw is near 0.25 s.
  const double mean_gap = a.back().arrival_ns / 1e9 / 49;
  EXPECT_GT(mean_gap, 0.1);
  EXPECT_LT(mean_gap, 0.5);
  RandomLoadOptions burst = options(1);
  burst.request_rate = std::numeric_limits<double>::infinity();
  for (const auto& r : random_load(burst)) EXPECT_EQ(r.arrival_ns, 0);
  // A dataset's arrivals come from the same generator.
  const auto at = load_arrivals(50, 4, 0.5, 1);
  for (size_t i = 0; i < at.size(); ++i) EXPECT_EQ(at[i], a[i].arrival_ns);
}

// A stand-in head: a ZeroMQ ROUTER on loopback whose thread hands each
// message that comes (its body) to `on_message`, with a way to answer its
// sender; it stops when it goes.
class StandInHead {
 public:
  using Reply = std::function<void(const transport::Message&)>;
  explicit StandInHead(std::function<void(const std::string& body, const Reply& reply)> on_message)
      : ctx_(zmq_ctx_new()), router_(zmq_socket(ctx_, ZMQ_ROUTER)) {
    const int linger = 0;
    zmq_setsockopt(router_, ZMQ_LINGER, &linger, sizeof linger);
    char endpoint[256];
    size_t len = sizeof endpoint;
    if (zmq_bind(router_, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, endpoint, &len) != 0) {
      zmq_close(router_);
      zmq_ctx_term(ctx_);
      throw std::runtime_error("the stand-in head cannot bind on loopback");
    }
    endpoint_ = endpoint;
    thread_ = std::thread([this, on_message = std::move(on_message)] {
      while (!stop_.load()) {
        zmq_pollitem_t item{router_, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, 50) <= 0) continue;
        std::vector<std::string> parts;  // [peer, body]
        for (int more = 1; more;) {
          zmq_msg_t part;
          zmq_msg_init(&part);
          if (zmq_msg_recv(&part, router_, 0) < 0) break;
          parts.emplace_back(static_cast<const char*>(zmq_msg_data(&part)), zmq_msg_size(&part));
          more = zmq_msg_more(&part);
          zmq_msg_close(&part);
        }
        if (parts.size() != 2) continue;
        on_message(parts[1], [&](const transport::Message& m) {
          const std::string body = transport::encode(m);
          zmq_send(router_, parts[0].data(), parts[0].size(), ZMQ_SNDMORE);
          zmq_send(router_, body.data(), body.size(), 0);
        });
      }
    });
  }
  ~StandInHead() {
    stop_ = true;
    thread_.join();
    zmq_close(router_);
    zmq_ctx_term(ctx_);
  }
  StandInHead(const StandInHead&) = delete;
  StandInHead& operator=(const StandInHead&) = delete;
  const std::string& endpoint() const { return endpoint_; }

 private:
  void* ctx_;
  void* router_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A head that takes requests and never answers (a ROUTER that only reads):
// each request fails once it has been silent for the timeout, with the
// reason, and the generator cancels it at the head; the run ends.
TEST(LoadGenerator, RequestsAHeadNeverAnswersFailAfterTheTimeoutAndAreCancelled) {
  std::atomic<int> submits{0}, cancels{0}, others{0};  // the frames the head heard
  StandInHead head([&](const std::string& body, const StandInHead::Reply&) {
    const transport::Decoded d = transport::decode(body);
    const std::string type = d.ok() ? transport::type_name(*d.message) : "undecodable";
    ++(type == "submit" ? submits : type == "cancel" ? cancels : others);
  });
  RandomLoadOptions ro = options(5);
  ro.num_requests = 2;
  ro.request_rate = std::numeric_limits<double>::infinity();
  LoadOptions lo;
  lo.to = head.endpoint();
  lo.timeout = std::chrono::seconds(1);
  const auto t0 = std::chrono::steady_clock::now();
  const LoadResult r = run_load(random_load(ro), lo);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The cancels left before run_load returned; the head reads them when it can.
  troupe::test::eventually([&] { return cancels.load() >= 2; }, std::chrono::seconds(30));
  ASSERT_EQ(r.requests.size(), 2u);
  for (const core::RequestTiming& t : r.requests) {
    EXPECT_FALSE(t.success);
    EXPECT_EQ(t.error, "no answer for 1 s");
  }
  EXPECT_GE(took, 1.0);  // not before the timeout
  EXPECT_EQ(submits.load(), 2);
  EXPECT_EQ(cancels.load(), 2);
  EXPECT_EQ(others.load(), 0);
}

// A head that streams one token a millisecond: the generator takes each on
// its client's socket thread, and the thread that called run_load is woken
// for the request's end and its own timers, not once per token (before,
// each token woke it: one futex wake-up and two context switches each).
TEST(LoadGenerator, StreamedTokensDoNotWakeTheCallingThreadEachTime) {
  constexpr int kTokens = 300;
  StandInHead head([&](const std::string& body, const StandInHead::Reply& reply) {
    const transport::Decoded d = transport::decode(body);
    if (!d.ok() || !std::holds_alternative<transport::Submit>(*d.message)) return;
    const uint64_t tag = std::get<transport::Submit>(*d.message).tag;
    for (int k = 0; k < kTokens; ++k) {
      transport::Tokens t;
      t.tag = tag;
      t.text = "x";
      t.ids = {k};
      reply(t);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    transport::Finished f;
    f.tag = tag;
    f.usage.completion_tokens = kTokens;
    reply(f);
  });
  RandomLoadOptions ro = options(6);
  ro.num_requests = 1;
  LoadOptions lo;
  lo.to = head.endpoint();
  // The calling thread's voluntary context switches.
  const auto switches_so_far = [] {
    return troupe::test::proc_number("/proc/thread-self/status", "voluntary_ctxt_switches");
  };
  const int64_t before = switches_so_far();
  const LoadResult r = run_load(random_load(ro), lo);
  const int64_t switches = switches_so_far() - before;
  ASSERT_EQ(r.requests.size(), 1u);
  EXPECT_TRUE(r.requests[0].success) << r.requests[0].error;
  EXPECT_EQ(r.requests[0].token_ns.size(), static_cast<size_t>(kTokens));
  ASSERT_GE(before, 0) << "no /proc/thread-self/status";
  // Its own waits (at most 50 ms each over a run of ~0.3 s or more) and the
  // client's start and stop, not one per token.
  EXPECT_LT(switches, kTokens / 3) << switches << " voluntary context switches for " << kTokens << " tokens";
}

TEST(LoadGenerator, BadOptionsAreRefused) {
  RandomLoadOptions o = options(1);
  o.request_rate = 0;
  EXPECT_THROW(random_load(o), std::invalid_argument);
  LoadOptions lo;
  EXPECT_THROW(run_load({}, lo), std::invalid_argument) << "neither --to nor --base-url";
  lo.to = "tcp://127.0.0.1:1";
  lo.base_url = "http://127.0.0.1:1";
  EXPECT_THROW(run_load({}, lo), std::invalid_argument) << "both";
  lo.to.clear();
  lo.base_url = "ftp://x";
  EXPECT_THROW(run_load({}, lo), std::invalid_argument);
}

TEST(SseParser, EventsSplitAnywhereAndInEveryLineEnding) {
  SseParser p;
  const std::string stream =
      ": a comment\n\ndata: {\"a\":1}\n\nevent: x\ndata: two\ndata: lines\r\n\r\ndata:[DONE]\r\r";
  std::vector<std::string> all;
  for (char c : stream) {  // one byte at a time: chunks may split anywhere
    for (auto& e : p.feed(&c, 1)) all.push_back(e);
  }
  EXPECT_EQ(all, (std::vector<std::string>{"{\"a\":1}", "two\nlines", "[DONE]"}));
  SseParser q;
  EXPECT_EQ(q.feed(stream.data(), stream.size()), all);
  EXPECT_TRUE(q.feed("data: half", 10).empty()) << "no event before its blank line";
  EXPECT_EQ(q.feed("\n\n", 2), std::vector<std::string>{"half"});
}

TEST(CompletionStream, PiecesUsageAndTheEndAsOpenAiSendsThem) {
  CompletionStream s;
  int pieces = 0;
  auto count = [&] { ++pieces; };
  const std::string a = "data: {\"choices\":[{\"text\":\"He\",\"finish_reason\":null}]}\n\n";
  EXPECT_TRUE(s.feed(200, a.data(), 10, 5, count)) << "half an event: nothing yet";
  EXPECT_EQ(pieces, 0);
  EXPECT_TRUE(s.feed(200, a.data() + 10, a.size() - 10, 7, count));
  const std::string b =
      "data: {\"choices\":[{\"text\":\"\"}]}\n\n"  // no text: not a piece
      "data: {\"choices\":[{\"text\":\"llo\",\"finish_reason\":\"length\"}]}\n\n"
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
  EXPECT_TRUE(s.feed(200, b.data(), b.size(), 9, count));
  const StreamedCompletion c = s.finish(200, "");
  EXPECT_EQ(c.error, "");
  EXPECT_EQ(c.text, "Hello");
  EXPECT_EQ(c.pieces, (std::vector<int64_t>{7, 9})) << "stamped when the event completed";
  EXPECT_EQ(pieces, 2);
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.prompt_tokens, 3);
  EXPECT_EQ(c.completion_tokens, 2);
}

TEST(CompletionStream, EveryWayToFailSaysWhy) {
  {
    CompletionStream s;
    const std::string body = R"({"error": {"message": "max_tokens must be >= 1", "type": "invalid"}})";
    EXPECT_TRUE(s.feed(400, body.data(), body.size(), 0, {}));
    const StreamedCompletion c = s.finish(400, "");
    EXPECT_EQ(c.status, 400);
    EXPECT_EQ(c.error, "HTTP 400: \"max_tokens must be >= 1\"");
  }
  {
    CompletionStream s;
    const std::string body = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {oops\n\n";
    EXPECT_FALSE(s.feed(200, body.data(), body.size(), 0, {})) << "a chunk that is not JSON ends the read";
    EXPECT_NE(s.finish(200, "Failed writing received data").error.find("not JSON"), std::string::npos)
        << "the body's reason, not the transport's";
  }
  {
    CompletionStream s;
    const std::string body = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
    EXPECT_TRUE(s.feed(200, body.data(), body.size(), 0, {}));
    EXPECT_EQ(s.finish(200, "").error, "the stream ended without [DONE]");
  }
  EXPECT_EQ(CompletionStream().finish(0, "Couldn't connect").error, "cannot reach the server: Couldn't connect");
  CompletionStream s;
  const std::string body = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
  EXPECT_TRUE(s.feed(200, body.data(), body.size(), 0, {}));
  EXPECT_EQ(s.finish(200, "Timeout was reached").error, "the stream broke: Timeout was reached");
}

// A server whose streams only begin once `n` of them are open at once: a
// client that serves its streams one after another never completes one.
struct GatedSseServer {
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::mutex mu;
  std::condition_variable cv;
  int open = 0;
  explicit GatedSseServer(int n) {
    server.new_task_queue = [n] { return new httplib::ThreadPool(static_cast<size_t>(n) + 2); };
    server.Post("/v1/completions", [this, n](const httplib::Request& req, httplib::Response& res) {
      if (req.body.find("\"bad\"") != std::string::npos) {
        res.status = 400;
        res.set_content(R"({"error":{"message":"bad prompt"}})", "application/json");
        return;
      }
      bool all = false;
      {
        std::unique_lock<std::mutex> lock(mu);
        ++open;
        cv.notify_all();
        all = cv.wait_for(lock, std::chrono::seconds(20), [&] { return open >= n; });
      }
      res.set_chunked_content_provider("text/event-stream", [all](size_t, httplib::DataSink& sink) {
        std::string out;
        if (all) {
          for (const char* t : {"a", "b", "c"}) {
            out += std::string("data: {\"choices\":[{\"text\":\"") + t + "\"}]}\n\n";
          }
          out += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":3}}\n\n";
          out += "data: [DONE]\n\n";
        } else {
          out = "data: {\"error\":{\"message\":\"the streams were not all open at once\"}}\n\ndata: [DONE]\n\n";
        }
        sink.write(out.data(), out.size());
        sink.done();
        return true;
      });
    });
    const ListenBacklog backlog(server);
    port = server.bind_to_any_port("127.0.0.1");
    backlog.after_bind();
    thread = std::thread([this] { server.listen_after_bind(); });
    // Connects queue in the listen backlog from bind on; stop() needs it running.
    while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~GatedSseServer() {
    server.stop();
    thread.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

TEST(OpenAiStreams, ManyStreamsRunAtOnceOnOneThread) {
  constexpr int kStreams = 12;
  GatedSseServer server(kStreams);
  int64_t clock = 0;
  std::vector<int> pieces(kStreams + 1, 0);
  OpenAiStreams streams(
      server.url() + "/v1", "", std::chrono::seconds(60), [&] { return ++clock; },
      [&](size_t id) { ++pieces[id]; });
  for (int i = 0; i < kStreams; ++i) streams.add({static_cast<size_t>(i), {{"prompt", "x"}, {"stream", true}}});
  streams.add({kStreams, {{"prompt", "bad"}}});
  std::vector<std::pair<size_t, StreamedCompletion>> ended;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (streams.in_flight() > 0 && std::chrono::steady_clock::now() < give_up) {
    for (auto& e : streams.poll(std::chrono::milliseconds(50))) ended.push_back(std::move(e));
  }
  ASSERT_EQ(ended.size(), kStreams + 1u);
  for (const auto& [id, c] : ended) {
    if (id == kStreams) {
      EXPECT_EQ(c.status, 400);
      EXPECT_EQ(c.error, "HTTP 400: \"bad prompt\"");
      continue;
    }
    EXPECT_EQ(c.error, "") << id;
    EXPECT_EQ(c.text, "abc");
    EXPECT_EQ(c.pieces.size(), 3u);
    EXPECT_EQ(pieces[id], 3);
    EXPECT_EQ(c.completion_tokens, 3);
    EXPECT_EQ(c.retries, 0);
  }
  EXPECT_THROW(list_models(server.url(), ""), std::runtime_error) << "404 (no /v1/models here) is an error";
}

TEST(OpenAiStreams, AServerThatIsNotThereFailsTheRequestAfterTwoRetries) {
  // A port that was free a moment ago and has no listener now.
  int port = 0;
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  OpenAiStreams streams("http://127.0.0.1:" + std::to_string(port), "", std::chrono::seconds(5),
                        [] { return int64_t{0}; });
  streams.add({7, {{"prompt", "x"}}});
  std::vector<std::pair<size_t, StreamedCompletion>> ended;
  for (int i = 0; i < 200 && ended.empty(); ++i) ended = streams.poll(std::chrono::milliseconds(50));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].first, 7u);
  EXPECT_EQ(ended[0].second.status, 0);
  EXPECT_EQ(ended[0].second.retries, 2);
  EXPECT_NE(ended[0].second.error.find("cannot reach the server"), std::string::npos) << ended[0].second.error;
  EXPECT_THROW(list_models("http://127.0.0.1:" + std::to_string(port), ""), std::runtime_error);
}

// Opens n connections to the port at once and counts the handshakes that
// complete within `wait` while nobody accepts: the listen queue's length.
int handshakes(int port, int n, std::chrono::milliseconds wait) {
  std::vector<pollfd> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);  // EINPROGRESS
    fds.push_back({fd, POLLOUT, 0});
  }
  const auto until = std::chrono::steady_clock::now() + wait;
  int done = 0;
  std::vector<bool> counted(n, false);
  while (done < n && std::chrono::steady_clock::now() < until) {
    ::poll(fds.data(), fds.size(), 20);
    for (int i = 0; i < n; ++i) {
      int err = -1;
      socklen_t len = sizeof err;
      if (counted[i] || !(fds[i].revents & POLLOUT)) continue;
      ::getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) {
        counted[i] = true;
        ++done;
        fds[i].events = 0;
      }
    }
  }
  for (const auto& f : fds) ::close(f.fd);
  return done;
}

TEST(ListenBacklog, ABurstOfConnectsIsQueuedNotDropped) {
  for (const bool wide : {false, true}) {
    httplib::Server server;
    std::optional<ListenBacklog> backlog;
    if (wide) backlog.emplace(server);
    const int port = server.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port, 0);
    if (wide) backlog->after_bind();
    const int queued = handshakes(port, 64, std::chrono::milliseconds(wide ? 5000 : 500));
    if (wide) {
      EXPECT_EQ(queued, 64);
    } else {
      EXPECT_LT(queued, 16) << "the library alone queues about 5 (if this fails, it now listens wider)";
    }
    std::thread t([&] { server.listen_after_bind(); });
    while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    server.stop();
    t.join();
  }
  // SO_REUSEADDR only: a second server cannot bind a port in use.
  httplib::Server a, b;
  const ListenBacklog la(a), lb(b);
  const int port = a.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  la.after_bind();
  EXPECT_FALSE(b.bind_to_port("127.0.0.1", port)) << "SO_REUSEPORT would let two servers share the port";
  std::thread t([&] { a.listen_after_bind(); });
  while (!a.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  a.stop();
  t.join();
}

TEST(OpenAiClient, BaseUrlIsAnOrigin) {
  EXPECT_EQ(server_origin("http://127.0.0.1:8000"), "http://127.0.0.1:8000");
  EXPECT_EQ(server_origin("http://127.0.0.1:8000/v1/"), "http://127.0.0.1:8000");
  EXPECT_THROW(server_origin("127.0.0.1:8000"), std::invalid_argument);
  EXPECT_THROW(server_origin("http://h:1/api/v1"), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::cluster
