// SocketLoop over real TCP on loopback, ephemeral ports: ROUTER server loop,
// DEALER client loops and raw sockets that send what a loop never would.
#include <gtest/gtest.h>

#include <atomic>

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
    server.loop.send_message(server.id, peer, Tokens{1, "a", {1}, {}});
    client.next();
  }  // the client's loop stops and its socket closes
  ASSERT_TRUE(wait_until([&] {
    server.loop.send_message(server.id, peer, Tokens{1, "b", {2}, {}});
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

}  // namespace
}  // namespace troupe::transport
