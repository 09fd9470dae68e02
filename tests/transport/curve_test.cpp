// CurveZMQ: keys and key files, the bind policy, the ZAP decisions, and live
// sockets: a client with an allowed key is served; one without (another key,
// no key, the wrong server key) never gets a frame to the server, and both
// sides are told why (SocketEvent, the server's log and handshake_failures).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <memory>

#include "loop_harness.hpp"
#include "test_utils.hpp"
#include "transport/curve_keys.hpp"
#include "transport/endpoint_policy.hpp"
#include "transport/zap_handler.hpp"

namespace troupe::transport {
namespace {

using test::client_of;
using test::Endpoint;
using test::server_on_loopback;
using test::wait_until;

TEST(CurveKeys, GeneratedPairsAreValidDistinctAndMatch) {
  ASSERT_TRUE(curve_available());
  KeyPair a = generate_keypair(), b = generate_keypair();
  EXPECT_TRUE(is_z85_key(a.public_key));
  EXPECT_TRUE(is_z85_key(a.secret_key));
  EXPECT_NE(a.secret_key, b.secret_key);
  EXPECT_EQ(public_key_of(a.secret_key), a.public_key);
  EXPECT_FALSE(is_z85_key(a.public_key.substr(1)));
  EXPECT_FALSE(is_z85_key(a.public_key.substr(1) + " "));
  EXPECT_FALSE(is_z85_key(std::string(40, '%'))) << "Z85 characters, but not a 32-byte value";
  EXPECT_THROW(public_key_of("short"), std::invalid_argument);
}

TEST(CurveKeys, SecretKeyFilesArePrivateAndReadBack) {
  troupe::test::TempDir dir;
  const KeyPair k = generate_keypair();
  const std::string path = dir.file("head.key");
  write_secret_key_file(path, k);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  KeyPair back = read_secret_key_file(path);
  EXPECT_EQ(back.public_key, k.public_key);
  EXPECT_EQ(back.secret_key, k.secret_key);
  try {
    write_secret_key_file(path, generate_keypair());
    FAIL() << "overwrote a key";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("exists: remove it first"), std::string::npos);
  }
  EXPECT_EQ(read_secret_key_file(path).secret_key, k.secret_key) << "the old key is intact";
  ::chmod(path.c_str(), 0644);
  try {
    read_secret_key_file(path);
    FAIL() << "read a world-readable secret key";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("may be read by others (mode 0644): run chmod 600"),
              std::string::npos)
        << e.what();
  }
}

TEST(CurveKeys, PublicKeyFilesListsAndFolders) {
  troupe::test::TempDir dir;
  const KeyPair a = generate_keypair(), b = generate_keypair(), c = generate_keypair();
  write_public_key_file(dir.file("a.pub"), a.public_key);
  EXPECT_EQ(load_public_key(dir.file("a.pub")), a.public_key);
  EXPECT_EQ(load_public_key(a.public_key), a.public_key) << "a key given literally";
  {
    std::ofstream list(dir.file("allowed"));
    list << "# workers\n\n  public-key = " << b.public_key << "  \n" << c.public_key << "\n";
  }
  EXPECT_EQ(read_public_keys(dir.file("allowed")), (std::vector<std::string>{b.public_key, c.public_key}));
  write_public_key_file(dir.file("b.pub"), b.public_key);
  EXPECT_EQ(read_public_keys(dir.path()), (std::vector<std::string>{a.public_key, b.public_key}))
      << "a folder: its *.pub files, in name order";
  {
    std::ofstream bad(dir.file("bad"));
    bad << "public-key = " << a.public_key << "\npublic-key: nope\n";
  }
  try {
    read_public_keys(dir.file("bad"));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("bad") + ":2: expected `public-key = <key>`"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_public_key(dir.file("allowed")), std::runtime_error) << "two keys where one is wanted";
  EXPECT_THROW(read_public_keys(dir.file("missing")), std::runtime_error);
  {
    std::ofstream mismatch(dir.file("mismatch.key"));
    mismatch << "public-key = " << a.public_key << "\nsecret-key = " << b.secret_key << "\n";
  }
  ::chmod(dir.file("mismatch.key").c_str(), 0600);
  EXPECT_THROW(read_secret_key_file(dir.file("mismatch.key")), std::runtime_error);
}

TEST(EndpointPolicy, OnlyLoopbackIsLocal) {
  for (const char* local : {"tcp://127.0.0.1:5555", "tcp://127.1.2.3:*", "tcp://localhost:1",
                            "tcp://[::1]:5555", "tcp://lo:5555", "ipc:///tmp/x", "inproc://a"})
    EXPECT_TRUE(is_local_endpoint(local)) << local;
  for (const char* remote :
       {"tcp://*:5555", "tcp://0.0.0.0:5555", "tcp://[::]:1", "tcp://198.18.0.1:5555", "tcp://eth0:5555",
        "tcp://128.0.0.1:1", "tcp://example.com:1", "udp://127.0.0.1:1", "tcp://127.0.0.1", "garbage"})
    EXPECT_FALSE(is_local_endpoint(remote)) << remote;
}

TEST(EndpointPolicy, NonLoopbackBindNeedsKeysOrInsecure) {
  EXPECT_NO_THROW(check_bind_security("tcp://127.0.0.1:5555", false, false));
  EXPECT_NO_THROW(check_bind_security("tcp://*:5555", true, false));
  EXPECT_NO_THROW(check_bind_security("tcp://*:5555", false, true));
  try {
    check_bind_security("tcp://0.0.0.0:5556", false, false);
    FAIL();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("refusing to listen on tcp://0.0.0.0:5556 without CurveZMQ"), std::string::npos);
    EXPECT_NE(what.find("--curve-secret-key"), std::string::npos);
    EXPECT_NE(what.find("--insecure"), std::string::npos);
  }
}

std::vector<std::string> zap_request(const std::string& domain, const std::string& mechanism,
                                     const std::string& credential) {
  std::vector<std::string> r = {"1.0", "7", domain, "127.0.0.1", "", mechanism};
  if (!credential.empty()) r.push_back(credential);
  return r;
}

std::string binary_key(const std::string& z85) {
  uint8_t b[32];
  zmq_z85_decode(b, z85.c_str());
  return std::string(reinterpret_cast<char*>(b), 32);
}

TEST(ZapHandler, AdmitsOnlyAllowedKeysOfTheSocketsDomain) {
  const KeyPair ok = generate_keypair(), other = generate_keypair();
  ZapHandler zap;
  zap.allow("troupe-0", {ok.public_key});
  auto d = zap.decide(zap_request("troupe-0", "CURVE", binary_key(ok.public_key)));
  EXPECT_TRUE(d.accepted);
  EXPECT_EQ(d.client_key, ok.public_key);
  auto reply = ZapHandler::reply(zap_request("troupe-0", "CURVE", binary_key(ok.public_key)), d);
  EXPECT_EQ(reply, (std::vector<std::string>{"1.0", "7", "200", "OK", ok.public_key, ""}));
  d = zap.decide(zap_request("troupe-0", "CURVE", binary_key(other.public_key)));
  EXPECT_FALSE(d.accepted);
  EXPECT_EQ(d.status, "400");
  EXPECT_EQ(d.reason, "client key not allowed");
  EXPECT_EQ(ZapHandler::reply(zap_request("troupe-0", "CURVE", ""), d)[4], "") << "no user id when refused";
  EXPECT_FALSE(zap.decide(zap_request("troupe-1", "CURVE", binary_key(ok.public_key))).accepted)
      << "another socket's domain";
  EXPECT_FALSE(zap.decide(zap_request("troupe-0", "PLAIN", "x")).accepted);
  EXPECT_FALSE(zap.decide(zap_request("troupe-0", "NULL", "")).accepted) << "a CURVE socket's domain";
  EXPECT_TRUE(zap.decide(zap_request("", "NULL", "")).accepted) << "a socket without keys";
  EXPECT_EQ(zap.decide({"2.0", "1"}).status, "500");
}

struct CurveCluster {
  KeyPair server = generate_keypair(), allowed = generate_keypair(), stranger = generate_keypair();

  SocketOptions server_options() const {
    SocketOptions o = server_on_loopback();
    o.curve_server = CurveServerKeys{server.secret_key, {allowed.public_key}};
    return o;
  }
  SocketOptions client_options(const std::string& ep, const KeyPair& own,
                               const std::string& server_key) const {
    SocketOptions o = client_of(ep);
    o.curve_client = CurveClientKeys{own.public_key, own.secret_key, server_key};
    return o;
  }
};

// A started CurveZMQ server of `c` and a started client of it with `own`
// keys that trusts `server_key`.
struct Dialled {
  Dialled(const CurveCluster& c, const KeyPair& own, const std::string& server_key)
      : server(c.server_options()) {
    server.loop.start();
    endpoint = server.loop.endpoint(server.id);
    client = std::make_unique<Endpoint>(c.client_options(endpoint, own, server_key));
    client->loop.start();
  }
  Endpoint server;
  std::string endpoint;
  std::unique_ptr<Endpoint> client;
};

TEST(CurveSockets, AllowedKeyIsServedBothWays) {
  CurveCluster c;
  Dialled d(c, c.allowed, c.server.public_key);
  Endpoint& server = d.server;
  d.client->loop.send_message(d.client->id, "", Cancel{11});
  EXPECT_EQ(std::get<Cancel>(server.next()).tag, 11u);
  server.loop.send_message(server.id, server.last_peer, Accepted{11, 3});
  EXPECT_EQ(std::get<Accepted>(d.client->next()).request_id, 3u);
  EXPECT_EQ(server.loop.stats().auth_accepted, 1u);
  EXPECT_EQ(server.loop.stats().auth_refused, 0u);
}

TEST(CurveSockets, AnotherKeyCanNeitherSubmitNorJoin) {
  CurveCluster c;
  Endpoint server(c.server_options());
  server.loop.start();
  const std::string ep = server.loop.endpoint(server.id);
  Endpoint stranger(c.client_options(ep, c.stranger, c.server.public_key));
  stranger.loop.start();
  Submit s;
  s.tag = 1;
  s.prompt = "let me in";
  stranger.loop.send_message(stranger.id, "", s);
  stranger.loop.send_message(stranger.id, "", Register{"intruder", {}});
  // The ZAP handler refuses the key ...
  ASSERT_TRUE(wait_until([&] { return server.loop.stats().auth_refused >= 1; }));
  EXPECT_TRUE(server.logs.contains("refused CurveZMQ client key=" + c.stranger.public_key));
  // ... and an allowed client's frame, sent after, is the only one that arrives.
  Endpoint friendly(c.client_options(ep, c.allowed, c.server.public_key));
  friendly.loop.start();
  friendly.loop.send_message(friendly.id, "", Cancel{2});
  EXPECT_EQ(std::get<Cancel>(server.next()).tag, 2u);
  EXPECT_EQ(server.loop.stats().frames_in, 1u);
  EXPECT_EQ(server.inbox.size(), 0u);
}

// The client side of a failed handshake, watched through a socket monitor.
bool handshake_fails(const std::string& ep, const std::function<void(zmq::socket_t&)>& configure) {
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  configure(dealer);
  zmq_socket_monitor(dealer.handle(), "inproc://monitor", ZMQ_EVENT_ALL);
  zmq::socket_t events(ctx, zmq::socket_type::pair);
  events.set(zmq::sockopt::rcvtimeo, static_cast<int>(test::kPatience.count()));
  events.connect("inproc://monitor");
  dealer.connect(ep);
  dealer.send(zmq::str_buffer("\x80"), zmq::send_flags::dontwait);
  for (;;) {
    std::vector<zmq::message_t> ev;
    if (!zmq::recv_multipart(events, std::back_inserter(ev))) return false;
    uint16_t id = 0;
    std::memcpy(&id, ev[0].data(), sizeof id);
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) return false;
    if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
        id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      zmq_socket_monitor(dealer.handle(), nullptr, 0);
      return true;
    }
  }
}

TEST(CurveSockets, NoKeyOrTheWrongServerKeyNeverGetsThrough) {
  CurveCluster c;
  Endpoint server(c.server_options());
  server.loop.start();
  const std::string ep = server.loop.endpoint(server.id);
  EXPECT_TRUE(handshake_fails(ep, [](zmq::socket_t&) {})) << "a plain (NULL mechanism) client";
  const KeyPair impostor = generate_keypair();
  EXPECT_TRUE(handshake_fails(ep, [&](zmq::socket_t& s) {
    s.set(zmq::sockopt::curve_serverkey, impostor.public_key);  // not the server's key
    s.set(zmq::sockopt::curve_publickey, c.allowed.public_key);
    s.set(zmq::sockopt::curve_secretkey, c.allowed.secret_key);
  })) << "an allowed client that trusts another server key";
  Endpoint friendly(c.client_options(ep, c.allowed, c.server.public_key));
  friendly.loop.start();
  friendly.loop.send_message(friendly.id, "", Cancel{3});
  EXPECT_EQ(std::get<Cancel>(server.next()).tag, 3u);
  EXPECT_EQ(server.loop.stats().frames_in, 1u) << "nothing else reached the server";
}

// The handshake failures both sides see, and say why (socket_event.hpp has
// what libzmq 4.3.4 reports in each case).
TEST(CurveSockets, KeylessClientFailsFastAndTheServerLogsAndCountsIt) {
  CurveCluster c;
  Endpoint server(c.server_options());
  server.loop.start();
  const std::string ep = server.loop.endpoint(server.id);
  Endpoint keyless(client_of(ep));
  keyless.loop.start();
  auto failed = keyless.events.first(SocketEvent::kHandshakeFailed);
  ASSERT_TRUE(failed) << "a client without keys is told, not left waiting";
  EXPECT_EQ(failed->address, ep);
  // Whichever side reads the other's greeting first names the mismatch; the other sees a broken pipe.
  EXPECT_NE(failed->reason.find("the server wants CurveZMQ keys this client does not have"),
            std::string::npos)
      << failed->reason;
  EXPECT_EQ(keyless.events.kinds().front(), SocketEvent::kConnected);
  EXPECT_TRUE(keyless.logs.contains("client: handshake with " + ep + " failed: "));
  auto seen = server.events.first(SocketEvent::kHandshakeFailed);
  ASSERT_TRUE(seen);
  const std::string why = "the client sent no CurveZMQ key / uses another mechanism";
  EXPECT_NE(seen->reason.find(why), std::string::npos) << seen->reason;
  EXPECT_EQ(seen->address, ep) << "the endpoint it listens on: libzmq does not name the client";
  ASSERT_TRUE(wait_until([&] { return server.loop.stats().handshake_failures >= 1; }));
  EXPECT_TRUE(server.logs.contains("server: a client's handshake failed at " + ep +
                                   " (libzmq names no client address): "));
  EXPECT_TRUE(server.logs.contains(why));
  EXPECT_EQ(server.loop.stats().auth_refused, 0u) << "it never reached the ZAP handler";
}

TEST(CurveSockets, KeyNotAllowedFailsWithAnAuthenticationReason) {
  CurveCluster c;
  Dialled d(c, c.stranger, c.server.public_key);
  Endpoint& server = d.server;
  auto failed = d.client->events.first(SocketEvent::kHandshakeFailed);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->reason, "authentication failed: the server does not allow this client's key (ZAP 400)");
  auto seen = server.events.first(SocketEvent::kHandshakeFailed);
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen->reason, "its key is not allowed on this socket (ZAP 400)");
  ASSERT_TRUE(wait_until([&] { return server.loop.stats().handshake_failures >= 1; }));
  EXPECT_GE(server.loop.stats().auth_refused, 1u);
  EXPECT_TRUE(server.logs.contains("server: refused CurveZMQ client key=" + c.stranger.public_key +
                                   " address=127.0.0.1: client key not allowed"))
      << "the ZAP handler's line names the socket, the key and the address";
}

TEST(CurveSockets, WrongServerKeyFailsOnEveryTryAndTheClientIsTold) {
  CurveCluster c;
  Dialled d(c, c.allowed, generate_keypair().public_key);
  Endpoint& server = d.server;
  auto failed = d.client->events.first(SocketEvent::kHandshakeFailed);
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->reason.find("the server hung up during the handshake"), std::string::npos)
      << failed->reason;
  EXPECT_NE(failed->reason.find("likely cause: the server key is wrong"), std::string::npos)
      << failed->reason;
  EXPECT_TRUE(d.client->events.first(SocketEvent::kConnectRetried)) << "libzmq tries again, and fails again";
  auto seen = server.events.first(SocketEvent::kHandshakeFailed);
  ASSERT_TRUE(seen);
  EXPECT_NE(seen->reason.find("it trusts another server key"), std::string::npos) << seen->reason;
  EXPECT_TRUE(server.logs.contains("it trusts another server key"));
}

TEST(CurveSockets, KeyedClientOfAPlainServerIsToldSo) {
  CurveCluster c;
  Endpoint server(server_on_loopback());
  server.loop.start();
  Endpoint keyed(c.client_options(server.loop.endpoint(server.id), c.allowed, c.server.public_key));
  keyed.loop.start();
  auto failed = keyed.events.first(SocketEvent::kHandshakeFailed);
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->reason.find("the server does not use CurveZMQ"), std::string::npos) << failed->reason;
  auto seen = server.events.first(SocketEvent::kHandshakeFailed);
  ASSERT_TRUE(seen);
  EXPECT_NE(seen->reason.find("the client uses CurveZMQ (or another mechanism) but this socket has no keys"),
            std::string::npos)
      << seen->reason;
}

// One loop, two CurveZMQ sockets, each with its own allowed keys (its own
// ZAP domain): a key allowed on one is refused on the other.
TEST(CurveSockets, TwoServerSocketsInOneLoopRefuseEachOthersKeys) {
  CurveCluster c;
  const KeyPair other = generate_keypair();
  Endpoint server(c.server_options());  // allows c.allowed
  SocketOptions b = server_on_loopback();
  b.name = "second";
  b.curve_server = CurveServerKeys{c.server.secret_key, {other.public_key}};
  const SocketId second = server.loop.add_socket(b);
  server.loop.start();
  const std::string ep_first = server.loop.endpoint(server.id), ep_second = server.loop.endpoint(second);
  Endpoint own_first(c.client_options(ep_first, c.allowed, c.server.public_key));
  Endpoint own_second(c.client_options(ep_second, other, c.server.public_key));
  Endpoint cross_second(c.client_options(ep_second, c.allowed, c.server.public_key));
  Endpoint cross_first(c.client_options(ep_first, other, c.server.public_key));
  for (Endpoint* e : {&own_first, &own_second, &cross_second, &cross_first}) e->loop.start();

  EXPECT_TRUE(own_first.events.first(SocketEvent::kHandshakeSucceeded));
  EXPECT_TRUE(own_second.events.first(SocketEvent::kHandshakeSucceeded));
  for (Endpoint* refused : {&cross_second, &cross_first}) {
    auto failed = refused->events.first(SocketEvent::kHandshakeFailed);
    ASSERT_TRUE(failed);
    EXPECT_NE(failed->reason.find("ZAP 400"), std::string::npos) << failed->reason;
  }
  EXPECT_TRUE(server.events.first(SocketEvent::kHandshakeFailed, server.id));
  EXPECT_TRUE(server.events.first(SocketEvent::kHandshakeFailed, second));
  EXPECT_TRUE(server.logs.contains("second: refused CurveZMQ client key=" + c.allowed.public_key));
  EXPECT_TRUE(server.logs.contains("server: refused CurveZMQ client key=" + other.public_key));

  for (Endpoint* e : {&cross_second, &cross_first}) e->loop.send_message(e->id, "", Cancel{9});
  own_first.loop.send_message(own_first.id, "", Cancel{1});
  own_second.loop.send_message(own_second.id, "", Cancel{2});
  std::map<SocketId, uint64_t> got;
  for (int i = 0; i < 2; ++i) {
    auto r = server.inbox.pop(test::kPatience);
    ASSERT_TRUE(r);
    got[r->socket] = std::get<Cancel>(r->message).tag;
  }
  EXPECT_EQ(got, (std::map<SocketId, uint64_t>{{server.id, 1}, {second, 2}}));
  EXPECT_EQ(server.loop.stats().frames_in, 2u) << "the refused clients got nothing through";
}

// One loop, a CurveZMQ socket and a plain loopback one: the ZAP handler the
// first needs does not stand in the second's way.
TEST(CurveSockets, PlainSocketBesideACurveSocketStillServes) {
  CurveCluster c;
  Endpoint server(c.server_options());
  const SocketId plain = server.loop.add_socket(server_on_loopback());
  server.loop.start();
  Endpoint client(client_of(server.loop.endpoint(plain)));
  client.loop.start();
  client.loop.send_message(client.id, "", Cancel{4});
  EXPECT_EQ(std::get<Cancel>(server.next()).tag, 4u);
  EXPECT_EQ(server.last_peer.empty(), false);
}

}  // namespace
}  // namespace troupe::transport
