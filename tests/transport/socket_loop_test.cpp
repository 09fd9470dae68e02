// SocketLoop over real TCP on loopback, ephemeral ports: ROUTER server loop,
// DEALER client loops and raw sockets that send what a loop never would.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <random>

#include "loop_harness.hpp"
#include "sample_messages.hpp"

namespace troupe::transport {
namespace {

using test::client_of;
using test::Endpoint;
using test::RawClient;
using test::server_on_loopback;
using test::wait_until;

TEST(SocketLoop, EphemeralBindReportsItsPortAndFramesFlowBothWays) {
  Endpoint server(server_on_loopback());
  server.loop.start();
  const std::string ep = server.loop.endpoint(server.id);
  ASSERT_EQ(ep.rfind("tcp://127.0.0.1:", 0), 0u) << ep;
  EXPECT_EQ(ep.find('*'), std::string::npos) << "the real port, not the wildcard: " << ep;

  Endpoint client(client_of(ep));
  client.loop.start();
  Submit s;
  s.tag = 5;
  s.prompt = "hi";
  ASSERT_TRUE(client.loop.send_message(client.id, "", s));
  auto got = std::get<Submit>(server.next());
  EXPECT_EQ(got.tag, 5u);
  EXPECT_FALSE(server.last_peer.empty()) << "the ROUTER names its peer";
  ASSERT_TRUE(server.loop.send_message(server.id, server.last_peer, Accepted{5, 99}));
  auto acc = std::get<Accepted>(client.next());
  EXPECT_EQ(acc.request_id, 99u);
  EXPECT_EQ(server.loop.stats().frames_in, 1u);
  // Counted after the send returns on the loop thread, maybe after the client has it.
  EXPECT_TRUE(wait_until([&] { return server.loop.stats().frames_out == 1; }));
}

TEST(SocketLoop, SendsFromManyThreadsAllArriveInOrderPerThread) {
  Endpoint server(server_on_loopback());
  server.loop.start();
  Endpoint client(client_of(server.loop.endpoint(server.id)));
  client.loop.start();
  const int kThreads = 4, kEach = 500;
  std::vector<std::thread> senders;
  for (int t = 0; t < kThreads; ++t)
    senders.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i)
        ASSERT_TRUE(client.loop.send_message(client.id, "", Cancel{uint64_t(t) << 32 | i}));
    });
  for (auto& th : senders) th.join();
  std::vector<uint64_t> next(kThreads, 0);
  for (int n = 0; n < kThreads * kEach; ++n) {
    const uint64_t tag = std::get<Cancel>(server.next()).tag;
    const int t = static_cast<int>(tag >> 32);
    ASSERT_LT(t, kThreads);
    EXPECT_EQ(tag & 0xffffffffu, next[t]++) << "thread " << t;
  }
}

// A hostile client: every kind of garbage gets its error frame, the server
// takes nothing from it, and its next good frame is served.
TEST(SocketLoop, GarbageFramesGetErrorsThenAGoodFrameIsServed) {
  Endpoint server(server_on_loopback());
  server.loop.start();
  RawClient raw(server.loop.endpoint(server.id));
  const std::string good = encode(test::sample_messages()[0]);
  struct Case {
    std::string body;
    ErrorCode code;
  };
  std::vector<Case> cases = {
      {"\x01\x02\x03 random bytes", ErrorCode::kMalformed},
      {good.substr(0, good.size() / 2), ErrorCode::kMalformed},
      {encode(Status{}).replace(encode(Status{}).find("status"), 6, "statux"), ErrorCode::kUnknownType},
      {"", ErrorCode::kMalformed},
  };
  std::string v2 = encode(Heartbeat{});
  v2[v2.find("\xa1v") + 2] = 2;  // "v": 1 -> 2
  cases.push_back({v2, ErrorCode::kBadVersion});
  for (const Case& c : cases) {
    raw.send(c.body);
    auto e = std::get<Error>(raw.receive());
    EXPECT_EQ(e.code, c.code) << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  raw.send(good);
  auto s = std::get<Submit>(server.next());
  EXPECT_EQ(s.tag, 42u);
  EXPECT_EQ(server.inbox.size(), 0u) << "only the good frame reached the handler";
  EXPECT_TRUE(server.logs.contains("unreadable frame")) << "garbage is logged";
}

TEST(SocketLoop, OversizeFramesAreAnsweredTooLargeAndGoNoFurther) {
  LoopOptions small;
  small.max_frame_bytes = 1024;
  Endpoint server(server_on_loopback(), small);
  server.loop.start();
  RawClient raw(server.loop.endpoint(server.id));
  Submit big;
  big.tag = 1;
  big.prompt = std::string(1500, 'x');
  raw.send(encode(big));
  auto e = std::get<Error>(raw.receive());
  EXPECT_EQ(e.code, ErrorCode::kTooLarge);
  EXPECT_NE(e.message.find("over the limit of 1024 bytes"), std::string::npos) << e.message;
  EXPECT_EQ(server.loop.stats().oversize, 1u);
  EXPECT_TRUE(server.logs.contains("over the limit of 1024 bytes"));
  // Past twice the limit libzmq drops the connection before reading: the
  // server stays up and serves the next client.
  big.prompt = std::string(5000, 'x');
  raw.send(encode(big));
  RawClient next(server.loop.endpoint(server.id));
  next.send(encode(Cancel{8}));
  EXPECT_EQ(std::get<Cancel>(server.next()).tag, 8u);
  EXPECT_EQ(server.loop.stats().frames_in, 1u) << "neither big frame reached the handler";
  // A loop refuses to send what its peer would refuse.
  EXPECT_FALSE(server.loop.send_message(server.id, server.last_peer, big));
}

TEST(SocketLoop, MultipartMessagesAreRefused) {
  Endpoint server(server_on_loopback());
  server.loop.start();
  RawClient raw(server.loop.endpoint(server.id));
  raw.send_parts({encode(Status{}), encode(Status{})});
  auto e = std::get<Error>(raw.receive());
  EXPECT_EQ(e.code, ErrorCode::kMalformed);
  EXPECT_EQ(e.message, "a message must be one body frame, got 2");
  EXPECT_EQ(server.loop.stats().bad_envelopes, 1u);
  raw.send(encode(Status{}));
  EXPECT_TRUE(std::holds_alternative<Status>(server.next()));
}

// A client that goes away mid-stream: sends to it are reported undeliverable
// (the router cancels its jobs on that), and the server serves the next one.
TEST(SocketLoop, VanishedClientIsReportedAndTheServerGoesOn) {
  Endpoint server(server_on_loopback());
  std::atomic<int> lost{0};
  std::string lost_peer;
  std::mutex m;
  server.loop.on_undeliverable([&](SocketId, const std::string& peer) {
    std::lock_guard<std::mutex> lock(m);
    lost_peer = peer;
    ++lost;
  });
  server.loop.start();
  const std::string ep = server.loop.endpoint(server.id);
  std::string peer;
  {
    Endpoint client(client_of(ep));
    client.loop.start();
    client.loop.send_message(client.id, "", Cancel{1});
    server.next();
    peer = server.last_peer;
    server.loop.send_message(server.id, peer, Tokens{1, "a", {1}, {}, {}, {}, {}});
    client.next();
  }  // the client's loop stops and its socket closes
  ASSERT_TRUE(wait_until([&] {
    server.loop.send_message(server.id, peer, Tokens{1, "b", {2}, {}, {}, {}, {}});
    return lost > 0;
  }));
  {
    std::lock_guard<std::mutex> lock(m);
    EXPECT_EQ(lost_peer, peer);
  }
  Endpoint again(client_of(ep));
  again.loop.start();
  again.loop.send_message(again.id, "", Cancel{2});
  EXPECT_EQ(std::get<Cancel>(server.next()).tag, 2u);
}

// A restarted server: the DEALER reconnects by itself (ZMQ_RECONNECT_IVL)
// under the same identity; reconnect() starts over under a new one.
TEST(SocketLoop, ClientReconnectsToARestartedServer) {
  std::string ep, first_peer;
  std::unique_ptr<Endpoint> client;
  {
    Endpoint first(server_on_loopback());
    first.loop.start();
    ep = first.loop.endpoint(first.id);
    client = std::make_unique<Endpoint>(client_of(ep));
    client->loop.start();
    client->loop.send_message(client->id, "", Cancel{1});
    EXPECT_EQ(std::get<Cancel>(first.next()).tag, 1u);
    first_peer = first.last_peer;
  }  // the server goes away
  SocketOptions same = server_on_loopback();
  same.endpoint = ep;
  Endpoint second(same);
  second.loop.start();
  ASSERT_TRUE(wait_until([&] {
    client->loop.send_message(client->id, "", Cancel{2});
    return second.inbox.size() > 0;
  }));
  EXPECT_EQ(std::get<Cancel>(second.next()).tag, 2u);
  EXPECT_EQ(second.last_peer, first_peer) << "same socket, same identity";
  client->loop.reconnect(client->id);
  client->loop.send_message(client->id, "", Cancel{3});
  Message m;
  do {  // Cancel{2}s sent while waiting may still come first
    m = second.next();
  } while (std::get<Cancel>(m).tag != 3);
  EXPECT_NE(second.last_peer, first_peer) << "a fresh socket, a fresh identity";
  EXPECT_TRUE(client->events.first(SocketEvent::kDisconnected)) << "the first server went";
  EXPECT_TRUE(client->events.first(SocketEvent::kConnectRetried)) << "ZeroMQ tried again";
}

TEST(SocketLoop, PlainClientSeesConnectedThenHandshakeSucceeded) {
  Endpoint server(server_on_loopback());
  server.loop.start();
  const std::string ep = server.loop.endpoint(server.id);
  Endpoint client(client_of(ep));
  client.loop.start();
  auto ok = client.events.first(SocketEvent::kHandshakeSucceeded);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->address, ep);
  EXPECT_EQ(ok->reason, "");
  const auto kinds = client.events.kinds();
  ASSERT_GE(kinds.size(), 2u);
  EXPECT_EQ(kinds[0], SocketEvent::kConnected);
  EXPECT_EQ(kinds[1], SocketEvent::kHandshakeSucceeded);
  client.loop.send_message(client.id, "", Cancel{1});
  server.next();
  EXPECT_TRUE(server.events.kinds().empty()) << "a server reports failed handshakes only";
  EXPECT_EQ(server.loop.stats().handshake_failures, 0u);
}

// Frames of a known order: "<n>:" and `pad` bytes.
constexpr size_t kPad = 64 * 1024;
constexpr int kSmallBuffer = 16 * 1024;  // the slow reader's SO_RCVBUF: the kernel holds little for it
std::string numbered(int n, size_t pad = kPad) { return std::to_string(n) + ":" + std::string(pad, 'x'); }
int number_of(const std::string& body) { return std::stoi(body.substr(0, body.find(':'))); }

// Sends numbered frames to `peer`, each once the loop has taken the one
// before, until `done` holds (or 2000 frames, far more than any kernel
// buffer holds); returns how many it sent.
int send_until(SocketLoop& loop, SocketId socket, const std::string& peer,
               const std::function<bool(const LoopStats&)>& done) {
  int sent = 0;
  while (!done(loop.stats()) && sent < 2000) {
    EXPECT_TRUE(loop.send(socket, peer, numbered(sent++)));
    wait_until([&] {
      const LoopStats s = loop.stats();
      return s.frames_out + s.backlogged_frames + s.cut_frames >= uint64_t(sent);
    });
  }
  return sent;
}

// A server whose slow reader (it reads nothing until told) has said hello.
struct SlowReader {
  explicit SlowReader(LoopOptions options = {}) : server(small_queue(), options) {
    server.loop.on_undeliverable([this](SocketId, const std::string&) { ++lost; });
    server.loop.on_lagging([this](SocketId, const std::string& p) {
      std::lock_guard<std::mutex> lock(mutex);
      lagging.push_back(p);
    });
    server.loop.start();
    client = std::make_unique<RawClient>(server.loop.endpoint(server.id), 1, kSmallBuffer);
    client->send(encode(Cancel{1}));
    server.next();
    peer = server.last_peer;
  }
  static SocketOptions small_queue() {
    SocketOptions o = server_on_loopback();
    o.send_hwm = 4;
    return o;
  }
  LoopStats stats() { return server.loop.stats(); }
  std::vector<std::string> lagging_peers() {
    std::lock_guard<std::mutex> lock(mutex);
    return lagging;
  }
  Endpoint server;
  std::unique_ptr<RawClient> client;
  std::string peer;
  std::atomic<int> lost{0};
  std::mutex mutex;
  std::vector<std::string> lagging;
};

// What the slow reader's queue cannot take waits in its backlog, in order,
// and leaves as it reads: nothing is lost.
TEST(SocketLoop, SlowReaderGetsEveryFrameInOrderThroughItsBacklog) {
  SlowReader r;
  int sent = send_until(r.server.loop, r.server.id, r.peer,
                        [](const LoopStats& s) { return s.backlogged_frames > 0; });
  ASSERT_GT(r.stats().backlogged_frames, 0u) << "the peer's queue never filled";
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(r.server.loop.send(r.server.id, r.peer, numbered(sent++)));
  for (int i = 0; i < sent; ++i) ASSERT_EQ(number_of(r.client->receive_body()), i);
  EXPECT_TRUE(wait_until([&] { return r.stats().frames_out == uint64_t(sent); }));
  EXPECT_EQ(r.stats().backlogged_frames, 0u);
  EXPECT_EQ(r.stats().undeliverable, 0u);
  EXPECT_EQ(r.lost, 0);
  EXPECT_EQ(r.stats().peers_cut, 0u);
}

// Past its bound a peer is cut: told once (on_lagging), sent what waited and
// the farewell, nothing else; once that is read it is an ordinary peer again.
TEST(SocketLoop, PeerPastItsBacklogBoundIsCutGetsAFarewellThenStartsOver) {
  LoopOptions o;
  o.max_peer_backlog_frames = 20;
  o.lagging_farewell = [](SocketId, const std::string&) {
    return encode(Error{ErrorCode::kUnexpected, "too slow", std::nullopt});
  };
  SlowReader r(o);
  const int sent =
      send_until(r.server.loop, r.server.id, r.peer, [](const LoopStats& s) { return s.peers_cut > 0; });
  ASSERT_EQ(r.stats().peers_cut, 1u);
  EXPECT_LE(r.stats().backlogged_frames, 21u) << "at most the bound, then the farewell";
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(r.server.loop.send(r.server.id, r.peer, numbered(sent + i)));
  ASSERT_TRUE(wait_until([&] { return r.stats().cut_frames == 11; })) << "the cutting frame and 10 more";
  for (int i = 0; i < sent - 1; ++i) ASSERT_EQ(number_of(r.client->receive_body()), i);
  auto farewell = std::get<Error>(r.client->receive());
  EXPECT_EQ(farewell.message, "too slow");
  ASSERT_TRUE(wait_until([&] { return r.stats().backlogged_frames == 0; }));
  EXPECT_EQ(r.lagging_peers(), std::vector<std::string>{r.peer}) << "told once";
  EXPECT_EQ(r.lost, 0);
  EXPECT_EQ(r.stats().undeliverable, 0u);
  EXPECT_TRUE(r.server.logs.contains("is too slow"));
  ASSERT_TRUE(r.server.loop.send(r.server.id, r.peer, numbered(9999, 0)));
  EXPECT_EQ(number_of(r.client->receive_body()), 9999) << "caught up, served again";
  EXPECT_TRUE(r.server.logs.contains("has caught up"));
  EXPECT_EQ(r.stats().cut_frames, 11u);
}

TEST(SocketLoop, PeerThatVanishesLosesItsBacklogReportedOnce) {
  SlowReader r;
  send_until(r.server.loop, r.server.id, r.peer,
             [](const LoopStats& s) { return s.backlogged_frames >= 30; });
  const uint64_t waiting = r.stats().backlogged_frames;
  ASSERT_GE(waiting, 30u);
  r.client.reset();
  ASSERT_TRUE(wait_until([&] { return r.stats().backlogged_frames == 0; }));
  EXPECT_EQ(r.lost, 1) << "one report for the whole backlog";
  // What waited, less what the kernel took before the peer went.
  EXPECT_GE(r.stats().undeliverable, 2u);
  EXPECT_LE(r.stats().undeliverable, waiting);
  EXPECT_TRUE(r.server.logs.contains(" frames for peer="));
  EXPECT_TRUE(r.server.logs.contains("dropped: the peer is gone"));
}

// Blocks `loop`'s thread in its first tick until release(). The state is
// shared with the loop's handler, which may still be returning from its wait
// when the test (and this object) ends.
struct StuckLoop {
  struct State {
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::atomic<bool> stuck{false};
  };
  explicit StuckLoop(SocketLoop& loop) {
    loop.on_tick([state = state](Clock::time_point) {
      if (!state->stuck.exchange(true)) state->released.wait();
    });
  }
  void release() { state->release.set_value(); }
  bool stuck() const { return state->stuck.load(); }
  std::shared_ptr<State> state = std::make_shared<State>();
};

TEST(SocketLoop, FullOutboxMakesTheSenderWaitNotDrop) {
  Endpoint server(server_on_loopback());
  server.loop.start();
  LoopOptions o;
  o.max_outbox = 8;
  o.outbox_wait = test::kPatience;
  Endpoint client(client_of(server.loop.endpoint(server.id)), o);
  StuckLoop stuck(client.loop);
  client.loop.start();
  ASSERT_TRUE(wait_until([&] { return stuck.stuck(); }));
  std::atomic<int> taken{0};
  std::thread sender([&] {
    for (uint64_t i = 0; i < 20; ++i)
      if (client.loop.send_message(client.id, "", Cancel{i})) ++taken;
  });
  ASSERT_TRUE(wait_until([&] { return client.loop.stats().outbox_waits >= 1; }));
  EXPECT_EQ(taken, 8) << "the ninth waits for room";
  stuck.release();
  sender.join();
  EXPECT_EQ(taken, 20);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(std::get<Cancel>(server.next()).tag, i);
  EXPECT_EQ(client.loop.stats().undeliverable, 0u);
}

TEST(SocketLoop, OutboxFullPastTheWaitRefusesWithALogLine) {
  LoopOptions o;
  o.max_outbox = 2;
  o.outbox_wait = std::chrono::milliseconds(1);
  Endpoint client(client_of("tcp://127.0.0.1:9"), o);
  StuckLoop stuck(client.loop);
  client.loop.start();
  ASSERT_TRUE(wait_until([&] { return stuck.stuck(); }));
  EXPECT_TRUE(client.loop.send(client.id, "", "a"));
  EXPECT_TRUE(client.loop.send(client.id, "", "b"));
  EXPECT_FALSE(client.loop.send(client.id, "", "c")) << "the loop takes nothing while stuck";
  EXPECT_EQ(client.loop.stats().undeliverable, 1u);
  EXPECT_EQ(client.loop.stats().outbox_waits, 1u);
  EXPECT_TRUE(client.logs.contains("client: outbox full (2 frames) for 1 ms: frame dropped"));
  stuck.release();
}

// A handler on the loop thread that finds the outbox full is refused at
// once: waiting there would wait for itself.
TEST(SocketLoop, LoopThreadNeverWaitsForItsOwnOutbox) {
  LoopOptions o;
  o.max_outbox = 1;
  o.outbox_wait = test::kPatience;
  Endpoint client(client_of("tcp://127.0.0.1:9"), o);
  std::atomic<int> taken{-1};
  client.loop.on_tick([&](Clock::time_point) {
    if (taken >= 0) return;
    const bool first = client.loop.send(client.id, "", "a"), second = client.loop.send(client.id, "", "b");
    taken = int(first) + int(second);
  });
  client.loop.start();
  ASSERT_TRUE(wait_until([&] { return taken >= 0; }));
  EXPECT_EQ(taken, 1) << "the first fits, the second is refused";
  EXPECT_EQ(client.loop.stats().outbox_waits, 0u);
  EXPECT_TRUE(client.logs.contains("client: outbox full (1 frames): frame dropped"));
}

TEST(SocketLoop, TickRunsOnTheLoopThread) {
  LoopOptions o;
  o.tick_interval = std::chrono::milliseconds(5);
  Endpoint server(server_on_loopback(), o);
  std::atomic<int> ticks{0};
  std::atomic<bool> same_thread{true};
  std::thread::id loop_thread;
  std::mutex m;
  server.loop.on_tick([&](Clock::time_point) {
    std::lock_guard<std::mutex> lock(m);
    if (ticks == 0) loop_thread = std::this_thread::get_id();
    if (std::this_thread::get_id() != loop_thread) same_thread = false;
    ++ticks;
  });
  server.loop.start();
  ASSERT_TRUE(wait_until([&] { return ticks >= 5; }));
  EXPECT_TRUE(same_thread);
  std::lock_guard<std::mutex> lock(m);
  EXPECT_NE(loop_thread, std::this_thread::get_id());
}

TEST(SocketLoop, StartFailsCleanlyWhenThePortIsTaken) {
  Endpoint first(server_on_loopback());
  first.loop.start();
  SocketOptions same = server_on_loopback();
  same.endpoint = first.loop.endpoint(first.id);
  SocketLoop second;
  second.add_socket(same);
  try {
    second.start();
    FAIL() << "bound a taken port";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot bind " + same.endpoint), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Address already in use"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(second.send(0, "x", "y")) << "a loop that did not start refuses to send";
}

TEST(SocketLoop, OptionsThatCannotWorkAreRefusedUpFront) {
  SocketLoop loop;
  SocketOptions open = server_on_loopback();
  open.endpoint = "tcp://0.0.0.0:*";
  EXPECT_THROW(loop.add_socket(open), std::invalid_argument);
  SocketOptions keyless = server_on_loopback();
  keyless.curve_server = CurveServerKeys{"not a key", {}};
  EXPECT_THROW(loop.add_socket(keyless), std::invalid_argument);
  SocketOptions mixed = client_of("tcp://127.0.0.1:9");
  mixed.curve_server = CurveServerKeys{};
  EXPECT_THROW(loop.add_socket(mixed), std::invalid_argument);
  LoopOptions zero;
  zero.tick_interval = std::chrono::milliseconds(0);
  EXPECT_THROW(SocketLoop{zero}, std::invalid_argument);
}

// A server's last word: frames queued before flush() reach the peer even
// though stop() follows at once (without it, linger 0 drops what is queued).
TEST(SocketLoop, FlushThenStopDeliversEverythingQueuedBefore) {
  Endpoint server(server_on_loopback());
  server.loop.start();
  Endpoint client(client_of(server.loop.endpoint(server.id)));
  client.loop.start();
  ASSERT_TRUE(client.loop.send_message(client.id, "", Cancel{1}));
  std::get<Cancel>(server.next());
  const int kFrames = 3000;
  for (int i = 0; i < kFrames; ++i)
    ASSERT_TRUE(server.loop.send_message(server.id, server.last_peer, Accepted{uint64_t(i), 0}));
  EXPECT_TRUE(server.loop.flush(test::kPatience));
  server.loop.stop();
  for (int i = 0; i < kFrames; ++i) ASSERT_EQ(std::get<Accepted>(client.next()).tag, uint64_t(i));
  EXPECT_FALSE(server.loop.flush(std::chrono::milliseconds(10))) << "not running any more";
}

TEST(SocketLoop, StopIsIdempotentAndSendsAfterItAreRefused) {
  Endpoint server(server_on_loopback());
  server.loop.start();
  server.loop.stop();
  server.loop.stop();
  EXPECT_FALSE(server.loop.send(server.id, "peer", "body"));
}

// A server that takes every TCP connection and closes it at once: a client
// of it connects, is disconnected and retries without end, its monitor
// reporting each step.
class SlammingListener {
 public:
  SlammingListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd_, 64) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("SlammingListener: cannot listen");
    endpoint_ = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) {
          const int c = ::accept(fd_, nullptr, nullptr);
          if (c >= 0) ::close(c);
        }
      }
    });
  }
  ~SlammingListener() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  int fd_ = -1;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// reconnect() closes a socket whose connection is coming and going. libzmq
// sends monitor events from its I/O thread with a blocking send: the old
// close order (the socket, then its monitor's reader) could leave an event
// with no reader and that thread blocked for ever, and with it every later
// connection of the loop (a chaos run's node never rejoined its head). After
// many such reconnects the client still connects.
TEST(SocketLoop, ReconnectsWhileConnectionsComeAndGoNeverStallTheSockets) {
  SlammingListener server;
  SocketOptions o = client_of(server.endpoint());
  o.reconnect_ivl_ms = 1;
  o.reconnect_ivl_max_ms = 1;
  Endpoint client(o);
  client.loop.start();
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    client.loop.reconnect(client.id);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  }
  auto connected = [&] {
    size_t n = 0;
    for (SocketEvent::Kind k : client.events.kinds()) n += k == SocketEvent::kConnected;
    return n;
  };
  // Every reconnect's command is handled by now (the loop logs each one).
  ASSERT_TRUE(wait_until([&] {
    std::lock_guard<std::mutex> lock(client.logs.mutex);
    size_t n = 0;
    for (const auto& l : client.logs.lines) n += l.find("reconnecting to") != std::string::npos;
    return n == 300;
  }));
  const size_t before = connected();
  EXPECT_TRUE(wait_until([&] { return connected() >= before + 20; }))
      << "libzmq's I/O thread stopped: no connection after the last reconnect (" << before << " before)";
}

}  // namespace
}  // namespace troupe::transport
