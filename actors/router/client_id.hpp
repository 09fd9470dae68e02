#pragma once
// Who a reply goes to: the front that took the job, and that front's own
// name for the client. The head routes each reply by `front` (a switch, in
// cluster/head.cpp); the router only compares ids.
#include <cstdint>
#include <string>
#include <tuple>

namespace troupe::actors {

enum class Front : uint8_t {
  kZmq,   // the ZeroMQ client socket (`troupe submit`, `troupe client`): `peer` is the routing id
  kHttp,  // the HTTP front: `number` is the request's, one per HTTP request
};

struct ClientId {
  Front front = Front::kZmq;
  uint64_t number = 0;  // kHttp
  std::string peer;     // kZmq: the ZeroMQ routing id (bytes)

  static ClientId zmq(std::string routing_id) { return {Front::kZmq, 0, std::move(routing_id)}; }
  static ClientId http(uint64_t request) { return {Front::kHttp, request, {}}; }

  friend bool operator<(const ClientId& a, const ClientId& b) {
    return std::tie(a.front, a.number, a.peer) < std::tie(b.front, b.number, b.peer);
  }
  friend bool operator==(const ClientId& a, const ClientId& b) {
    return a.front == b.front && a.number == b.number && a.peer == b.peer;
  }
  friend bool operator!=(const ClientId& a, const ClientId& b) { return !(a == b); }
};

}  // namespace troupe::actors
