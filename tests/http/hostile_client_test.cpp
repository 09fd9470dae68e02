// Black-box tests of `troupe serve --http` against clients that do not mean
// well or are merely slow: slow headers, large unauthenticated bodies,
// pipelining, thousands of idle connections, hundreds of streams, clients
// that half-close, and every limit's answer. Each talks raw HTTP/1.1 over
// its own sockets (raw_http.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "raw_http.hpp"
#include "serve_process.hpp"

using nlohmann::json;
using troupe::test::eventually;
using troupe::test::ServeProcess;
namespace raw = troupe::test::raw;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

// Under AddressSanitizer (scripts/test.sh's second stage runs these tests
// against an instrumented troupe) every allocation carries shadow memory and
// a quarantine: memory bounds are 4x looser there.
#if defined(__SANITIZE_ADDRESS__)
constexpr long kMemoryScale = 4;
#else
constexpr long kMemoryScale = 1;
#endif

std::string greedy(int max_tokens, bool stream = false, const std::string& prompt = "Hello world") {
  return json{{"prompt", prompt},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true},
              {"stream", stream}}
      .dump();
}

// Samples a process's resident memory every 20 ms while alive; the peak in KiB.
class PeakRss {
 public:
  explicit PeakRss(const ServeProcess& p)
      : proc_(p), thread_([this] {
          while (!stop_) {
            peak_ = std::max(peak_.load(), proc_.rss_kib());
            std::this_thread::sleep_for(milliseconds(20));
          }
        }) {}
  ~PeakRss() { stop(); }
  long stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return peak_;
  }

 private:
  const ServeProcess& proc_;
  std::atomic<bool> stop_{false};
  std::atomic<long> peak_{0};
  std::thread thread_;
};

// The one completion a test times while something else loads the server.
std::pair<raw::Response, double> timed_completion(const ServeProcess& serve) {
  const auto t0 = Clock::now();
  const int fd = raw::connect_to(serve.http());
  EXPECT_GE(fd, 0);
  raw::send_all(fd, raw::post("/v1/completions", greedy(8)));
  auto rs = raw::read_responses(fd, 1, seconds(60));
  ::close(fd);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return {rs.empty() ? raw::Response{} : rs[0], s};
}

}  // namespace

// 300 connections sending their header one byte every 2 s (slowloris) hold
// nothing: a completion beside them is served at once, and each of them
// gets a 408 once its header is past --http-header-timeout (5 s).
TEST(HttpHostile, SlowHeadersHoldNothing) {
  raw::raise_file_limit();
  ServeProcess serve;
  const std::string header = "GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: ";
  std::vector<int> slow;
  for (int i = 0; i < 300; ++i) {
    const int fd = raw::connect_to(serve.http());
    ASSERT_GE(fd, 0) << i;
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (size_t k = 0; !stop; ++k) {
      for (int fd : slow) ::send(fd, &header[k % header.size()], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      for (int i = 0; i < 20 && !stop; ++i) std::this_thread::sleep_for(milliseconds(100));
    }
  });
  std::this_thread::sleep_for(milliseconds(500));
  for (int i = 0; i < 3; ++i) {
    const auto [r, s] = timed_completion(serve);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_LT(s, 2.0) << "a completion beside 300 slow headers took " << s << " s";
  }
  std::this_thread::sleep_for(seconds(6));  // past the header timeout
  stop = true;
  trickle.join();
  int timed_out = 0;
  for (int fd : slow) {
    auto rs = raw::read_responses(fd, 1, seconds(5));
    if (rs.size() == 1 && rs[0].status == 408) ++timed_out;
    ::close(fd);
  }
  EXPECT_EQ(timed_out, 300);
  EXPECT_EQ(timed_completion(serve).first.status, 200);
}

// 32 clients each declaring a 15 MiB body with a wrong key: 401 on the
// header alone, nothing buffered (the head's RSS grows by under 64 MB);
// a declared body over --http-max-body-bytes is 413 before a byte of it is
// sent, and a chunked one is cut at the limit.
TEST(HttpHostile, BodiesAreRefusedBeforeTheyAreRead) {
  ServeProcess serve({"--api-key", "sekrit"});
  EXPECT_EQ(timed_completion(serve).first.status, 401);
  const long before = serve.rss_kib();
  PeakRss peak(serve);
  const size_t body_bytes = size_t{15} << 20;
  std::vector<int> statuses(32, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < 32; ++i) {
    clients.emplace_back([&, i] {
      const int fd = raw::connect_to(serve.http());
      if (fd < 0) return;
      raw::send_all(fd,
                    "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong\r\n"
                    "Content-Type: application/json\r\nContent-Length: " +
                        std::to_string(body_bytes) + "\r\n\r\n");
      ::fcntl(fd, F_SETFL, O_NONBLOCK);
      const std::string chunk(65536, 'x');
      size_t sent = 0;
      raw::Parser parser;
      char buf[4096];
      const auto deadline = Clock::now() + seconds(30);
      bool writable = true;
      while (Clock::now() < deadline) {
        pollfd p{fd, static_cast<short>(POLLIN | (writable && sent < body_bytes ? POLLOUT : 0)), 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        if (p.revents & POLLIN) {
          const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
          if (n <= 0) parser.closed();
          if (n > 0) parser.feed(buf, static_cast<size_t>(n));
          if (auto r = parser.next()) {
            statuses[i] = r->status;
            break;
          }
          if (n <= 0) break;
        }
        if (p.revents & POLLOUT) {
          const ssize_t n = ::send(fd, chunk.data(), std::min(chunk.size(), body_bytes - sent), MSG_NOSIGNAL);
          if (n > 0) sent += static_cast<size_t>(n);
          if (n < 0 && errno != EAGAIN) writable = false;
        }
      }
      ::close(fd);
    });
  }
  for (auto& t : clients) t.join();
  const long grew_kib = peak.stop() - before;
  for (int i = 0; i < 32; ++i) EXPECT_EQ(statuses[i], 401) << "client " << i;
  EXPECT_LT(grew_kib, kMemoryScale * 64 * 1024)
      << "32 unauthenticated 15 MiB bodies grew the head by " << grew_kib << " KiB";
  std::printf("32 unauthenticated 15 MiB bodies: head RSS %ld -> peak +%ld KiB\n", before, grew_kib);

  const std::string key = "Authorization: Bearer sekrit\r\n";
  {  // declared too large: refused with nothing sent
    const int fd = raw::connect_to(serve.http());
    raw::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + key +
                          "Content-Length: " + std::to_string(size_t{17} << 20) + "\r\n\r\n");
    auto rs = raw::read_responses(fd, 1, seconds(5));
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_EQ(rs[0].status, 413) << rs[0].body;
    EXPECT_NE(rs[0].body.find("--http-max-body-bytes"), std::string::npos) << rs[0].body;
    ::close(fd);
  }
  {  // chunked, no length: cut at the limit
    const int fd = raw::connect_to(serve.http());
    raw::send_all(
        fd, "POST /v1/completions HTTP/1.1\r\nHost: t\r\n" + key + "Transfer-Encoding: chunked\r\n\r\n");
    const std::string piece = "100000\r\n" + std::string(0x100000, ' ') + "\r\n";  // 1 MiB chunks
    for (int i = 0; i < 20 && raw::send_all(fd, piece); ++i) {
    }
    auto rs = raw::read_responses(fd, 1, seconds(5));
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_EQ(rs[0].status, 413) << rs[0].body;
    ::close(fd);
  }
  const int fd = raw::connect_to(serve.http());
  raw::send_all(fd, raw::post("/v1/completions", greedy(4), key));
  auto rs = raw::read_responses(fd, 1, seconds(30));
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, 200) << rs[0].body;
  ::close(fd);
}

// Requests sent back to back on one connection, before any answer, are all
// answered, in order (2 and 10 of them, completions and other routes mixed).
TEST(HttpHostile, PipelinedRequestsAreAnsweredInOrder) {
  ServeProcess serve;
  for (const int k : {2, 10}) {
    std::string all;
    for (int i = 0; i < k; ++i) {
      all += i % 3 == 1 ? raw::get("/v1/models") : raw::post("/v1/completions", greedy(i + 1));
    }
    const int fd = raw::connect_to(serve.http());
    ASSERT_TRUE(raw::send_all(fd, all));
    const auto rs = raw::read_responses(fd, static_cast<size_t>(k), seconds(60));
    ASSERT_EQ(rs.size(), static_cast<size_t>(k)) << "of " << k << " pipelined requests";
    for (int i = 0; i < k; ++i) {
      ASSERT_EQ(rs[i].status, 200) << i << ": " << rs[i].body;
      const json j = json::parse(rs[i].body);
      if (i % 3 == 1) {
        EXPECT_EQ(j["object"], "list") << i;
      } else {
        EXPECT_EQ(j["usage"]["completion_tokens"], i + 1) << "answer " << i << " is request " << i << "'s";
      }
    }
    ::close(fd);
  }
}

// A client that shuts its sending side after its request still reads: it
// gets its whole answer, plain or streamed (HTTP allows the half-close).
TEST(HttpHostile, AHalfClosedClientIsAnswered) {
  ServeProcess serve;
  for (const bool stream : {false, true}) {
    json body = json::parse(greedy(200, stream));
    body["n"] = 4;  // long enough for the server to notice the half-close meanwhile
    const int fd = raw::connect_to(serve.http());
    raw::send_all(fd, raw::post("/v1/completions", body.dump()));
    ::shutdown(fd, SHUT_WR);
    const auto rs = raw::read_responses(fd, 1, seconds(120));
    ASSERT_EQ(rs.size(), 1u) << (stream ? "streamed" : "plain");
    EXPECT_EQ(rs[0].status, 200) << rs[0].body;
    if (stream) {
      EXPECT_NE(rs[0].body.find("data: [DONE]"), std::string::npos) << rs[0].body;
    } else {
      EXPECT_EQ(json::parse(rs[0].body)["usage"]["completion_tokens"], 800) << rs[0].body;
    }
    ::close(fd);
  }
}

// 2,000 idle connections and 256 concurrent SSE streams (32 tokens each) at
// once, on the head's 2 event-loop threads: every stream whole, all served at
// once, memory bounded.
TEST(HttpHostile, ThousandsOfIdleConnectionsAndHundredsOfStreams) {
  if (raw::raise_file_limit() < 2600) GTEST_SKIP() << "this process may not open 2,600 files (ulimit -n)";
  ServeProcess serve({"--http-header-timeout", "300", "--max-num-seqs", "256"});
  EXPECT_EQ(timed_completion(serve).first.status, 200);  // warm
  const long before = serve.rss_kib();
  PeakRss peak(serve);
  std::vector<int> idle;
  for (int i = 0; i < 2000; ++i) {
    const int fd = raw::connect_to(serve.http());
    ASSERT_GE(fd, 0) << "idle connection " << i;
    idle.push_back(fd);
  }
  constexpr int kStreams = 256, kTokens = 32;
  std::vector<int> fds;
  std::vector<raw::Parser> parsers(kStreams);
  std::vector<std::optional<raw::Response>> done(kStreams);
  // Every request but its last byte first, then the last bytes back to back:
  // all 256 arrive within a moment, so none can end before another began.
  std::vector<std::string> requests;
  for (int i = 0; i < kStreams; ++i) {
    const int fd = raw::connect_to(serve.http());
    ASSERT_GE(fd, 0) << "stream " << i;
    requests.push_back(
        raw::post("/v1/completions", greedy(kTokens, true, "Stream number " + std::to_string(i))));
    raw::send_all(fd, requests.back().substr(0, requests.back().size() - 1));
    fds.push_back(fd);
  }
  for (int i = 0; i < kStreams; ++i) raw::send_all(fds[i], requests[i].substr(requests[i].size() - 1));
  // When each stream's first bytes came, and when it ended.
  std::vector<Clock::time_point> began(kStreams, Clock::time_point::max()),
      ended(kStreams, Clock::time_point::max());
  int finished = 0;
  char buf[65536];
  const auto deadline = Clock::now() + seconds(240);
  while (finished < kStreams && Clock::now() < deadline) {
    std::vector<pollfd> p;
    for (int i = 0; i < kStreams; ++i) p.push_back({fds[i], static_cast<short>(done[i] ? 0 : POLLIN), 0});
    if (::poll(p.data(), p.size(), 200) <= 0) continue;
    for (int i = 0; i < kStreams; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
      const ssize_t n = ::recv(fds[i], buf, sizeof buf, 0);
      if (n > 0 && began[i] == Clock::time_point::max()) began[i] = Clock::now();
      if (n <= 0) parsers[i].closed();
      if (n > 0) parsers[i].feed(buf, static_cast<size_t>(n));
      if ((done[i] = parsers[i].next()) || n <= 0) {
        ++finished;
        ended[i] = Clock::now();
      }
      if (n <= 0 && !done[i]) done[i] = raw::Response{};
    }
  }
  // The idle ones are still there, and the server still answers a new one.
  const auto [health, s] = timed_completion(serve);
  EXPECT_EQ(health.status, 200);
  const long grew_kib = peak.stop() - before;
  int whole = 0;
  for (int i = 0; i < kStreams; ++i) {
    if (!done[i] || done[i]->status != 200) continue;
    int chunks = 0;
    std::istringstream in(done[i]->body);
    for (std::string line; std::getline(in, line);) chunks += line.rfind("data: {", 0) == 0;
    whole += chunks >= kTokens && done[i]->body.find("data: [DONE]") != std::string::npos;
  }
  EXPECT_EQ(whole, kStreams);
  // Served at once, not in turns: every stream had begun before the first one ended.
  EXPECT_LT(*std::max_element(began.begin(), began.end()), *std::min_element(ended.begin(), ended.end()))
      << "some streams waited for others to end";
  pollfd probe{idle.back(), POLLIN, 0};
  EXPECT_EQ(::poll(&probe, 1, 0), 0) << "an idle connection was closed (or answered)";
  EXPECT_LT(grew_kib, kMemoryScale * 256 * 1024)
      << "2,000 idle connections and 256 streams grew the head by " << grew_kib << " KiB";
  std::printf("2,000 idle connections + 256 streams of %d tokens: head RSS %ld KiB -> peak +%ld KiB\n",
              kTokens, before, grew_kib);
  for (int fd : idle) ::close(fd);
  for (int fd : fds) ::close(fd);
}

// Each limit answers with its status, and changes nothing else.
TEST(HttpHostile, EachLimitAnswersWithItsStatus) {
  ServeProcess serve({"--http-header-timeout", "2", "--http-body-timeout", "2", "--http-keep-alive", "1",
                      "--http-max-header-bytes", "4096"});
  auto one = [&](const std::string& bytes, seconds wait = seconds(10)) {
    const int fd = raw::connect_to(serve.http());
    raw::send_all(fd, bytes);
    auto rs = raw::read_responses(fd, 1, wait);
    const bool closed = raw::closed_within(fd, seconds(5));
    ::close(fd);
    return std::make_pair(rs.empty() ? raw::Response{} : rs[0], closed);
  };
  {
    auto [r, closed] = one(raw::get("/health", "X-Big: " + std::string(5000, 'a') + "\r\n"));
    EXPECT_EQ(r.status, 431) << r.body;
    EXPECT_NE(r.body.find("--http-max-header-bytes"), std::string::npos) << r.body;
    EXPECT_TRUE(closed);
  }
  {
    const auto t0 = Clock::now();
    auto [r, closed] = one("GET /health HTTP/1.1\r\nHost: t\r\n");
    EXPECT_EQ(r.status, 408) << r.body;
    EXPECT_NE(r.body.find("--http-header-timeout"), std::string::npos) << r.body;
    EXPECT_LT(Clock::now() - t0, seconds(6));
    EXPECT_TRUE(closed);
  }
  {
    auto [r, closed] =
        one("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"prompt\"");
    EXPECT_EQ(r.status, 408) << r.body;
    EXPECT_NE(r.body.find("--http-body-timeout"), std::string::npos) << r.body;
    EXPECT_TRUE(closed);
  }
  {
    auto [r, closed] = one("BLAH\r\n\r\n");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error") << r.body;
    EXPECT_TRUE(closed);
  }
  {
    auto [r, closed] = one(raw::post("/v1/completions", R"({"prompt": "a", "temperature": 1e999})"));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], "temperature") << r.body;
    EXPECT_TRUE(closed) << "an idle kept-alive connection is closed after --http-keep-alive";
  }
  EXPECT_EQ(timed_completion(serve).first.status, 200);

  // Past --http-max-connections: a 503 with Retry-After at once, not a queue.
  ServeProcess few({"--http-max-connections", "8", "--http-header-timeout", "60"});
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) held.push_back(raw::connect_to(few.http()));
  std::this_thread::sleep_for(milliseconds(200));
  const auto t0 = Clock::now();
  const int extra = raw::connect_to(few.http());
  auto rs = raw::read_responses(extra, 1, seconds(5));
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].status, 503) << rs[0].body;
  EXPECT_EQ(rs[0].headers["retry-after"], "1");
  EXPECT_NE(rs[0].body.find("--http-max-connections"), std::string::npos) << rs[0].body;
  EXPECT_LT(Clock::now() - t0, seconds(2));
  ::close(extra);
  ::close(held.back());
  held.pop_back();
  EXPECT_TRUE(eventually([&] { return timed_completion(few).first.status == 200; }, seconds(10)));
  for (int fd : held) ::close(fd);
}
