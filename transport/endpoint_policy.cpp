#include "transport/endpoint_policy.hpp"

#include <arpa/inet.h>

#include <stdexcept>
#include <string>

namespace troupe::transport {

bool is_local_endpoint(std::string_view endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  std::string_view hostport = endpoint.substr(6);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string_view::npos) return false;
  std::string host(hostport.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost" || host == "lo") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

void check_bind_security(std::string_view endpoint, bool has_curve_keys, bool insecure) {
  if (has_curve_keys || insecure || is_local_endpoint(endpoint)) return;
  throw std::invalid_argument(
      "refusing to listen on " + std::string(endpoint) +
      " without CurveZMQ: anyone who can reach it could submit jobs or join as a worker. Give "
      "--curve-secret-key and --curve-allowed-keys (make keys with `troupe keygen`), listen on a loopback "
      "address "
      "(tcp://127.0.0.1:PORT), or pass --insecure on a network you trust");
}

}  // namespace troupe::transport
