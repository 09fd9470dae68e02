#pragma once
// Client admission for CurveZMQ server sockets: the decisions of a ZAP
// handler (ZeroMQ Authentication Protocol, RFC 27). libzmq asks the handler
// bound at inproc://zeromq.zap.01 of the socket's context about each new
// CURVE connection; a client is admitted when its long-term public key is in
// the allowed set of the socket's ZAP domain. SocketLoop owns the REP socket
// and calls this class on its own thread; the class itself does no I/O.
#include <set>
#include <string>
#include <vector>

namespace troupe::transport {

class ZapHandler {
 public:
  static constexpr const char* kEndpoint = "inproc://zeromq.zap.01";

  struct Decision {
    bool accepted = false;
    std::string status;      // "200" admitted, "400" refused, "500" unreadable request
    std::string reason;      // status text, also for the log
    std::string client_key;  // Z85 public key of the client (CURVE), else empty
    std::string address;     // the client's IP address, for the log
  };

  // Admits `z85_keys` (public keys) to the sockets whose ZAP domain is `domain`.
  void allow(const std::string& domain, const std::vector<std::string>& z85_keys);

  // Decides one request, given its frames after the REP envelope: version
  // "1.0", request id, domain, address, identity, mechanism, credentials.
  Decision decide(const std::vector<std::string>& request) const;

  // The reply frames (version, request id, status, text, user id =
  // client key when admitted, empty metadata).
  static std::vector<std::string> reply(const std::vector<std::string>& request, const Decision& decision);

 private:
  struct Domain {
    std::string name;
    std::set<std::string> keys;  // 32-byte binary public keys
  };
  std::vector<Domain> domains_;
};

}  // namespace troupe::transport
