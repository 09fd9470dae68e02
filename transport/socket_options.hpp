#pragma once
// What one socket of a SocketLoop is: its role, endpoint, CurveZMQ keys and
// ZeroMQ limits, and the check that they can work.
#include <optional>
#include <string>
#include <vector>

namespace troupe::transport {

using SocketId = int;  // a SocketLoop's sockets, in the order of add_socket, from 0

// A server's side of CurveZMQ.
struct CurveServerKeys {
  std::string secret_key;                    // Z85, this server's long-term secret key
  std::vector<std::string> allowed_clients;  // Z85 public keys; no other client gets in (empty: none does)
};

// A client's side of CurveZMQ.
struct CurveClientKeys {
  std::string public_key;  // Z85, this client's key pair
  std::string secret_key;
  std::string server_key;  // Z85 public key of the server it connects to
};

struct SocketOptions {
  enum class Role {
    kServer,  // ROUTER; binds `endpoint`
    kClient,  // DEALER; connects to `endpoint`
  };
  Role role = Role::kServer;
  // "tcp://127.0.0.1:5555"; a server may bind port * (see SocketLoop::endpoint).
  std::string endpoint;
  std::string name;                             // in log lines ("frontend", "backend", "head")
  std::optional<CurveServerKeys> curve_server;  // kServer only; nullopt = no encryption
  std::optional<CurveClientKeys> curve_client;  // kClient only; nullopt = no encryption
  bool insecure = false;  // kServer: allow a non-loopback endpoint without keys (--insecure)
  // kClient: ms before the first retry after a lost connection (ZMQ_RECONNECT_IVL).
  int reconnect_ivl_ms = 100;
  // kClient: retries double up to this many ms (ZMQ_RECONNECT_IVL_MAX); 0 = no doubling.
  int reconnect_ivl_max_ms = 5000;
  // Frames queued per peer; past it a send is dropped and reported; 0 = no limit.
  int send_hwm = 10000;
  int recv_hwm = 10000;  // frames queued per peer on receipt; 0 = no limit
  // ZMTP PINGs every this many ms; a connection silent 3x as long is dropped; 0 = off.
  int tcp_heartbeat_ms = 2000;
};

// Throws std::invalid_argument when the options cannot work: no endpoint,
// keys of the other role, keys that are not Z85, a non-loopback server
// without keys and without `insecure` (check_bind_security). (A CurveZMQ
// server that allows no key is valid: it lets nobody in, as a head does on
// its worker socket when no worker key is given.)
void validate(const SocketOptions& options);

}  // namespace troupe::transport
