#include "transport/socket_options.hpp"

#include <stdexcept>

#include "transport/curve_keys.hpp"
#include "transport/endpoint_policy.hpp"

namespace troupe::transport {

void validate(const SocketOptions& o) {
  const std::string what = "socket " + (o.name.empty() ? o.endpoint : o.name) + ": ";
  if (o.endpoint.empty()) throw std::invalid_argument(what + "no endpoint");
  if (o.role == SocketOptions::Role::kServer) {
    if (o.curve_client) throw std::invalid_argument(what + "a server socket takes curve_server keys");
    if (o.curve_server) {
      if (!is_z85_key(o.curve_server->secret_key))
        throw std::invalid_argument(what + "the CurveZMQ secret key is not 40 Z85 characters");
      for (const auto& k : o.curve_server->allowed_clients)
        if (!is_z85_key(k))
          throw std::invalid_argument(what + "an allowed client key is not 40 Z85 characters");
    }
    check_bind_security(o.endpoint, o.curve_server.has_value(), o.insecure);
  } else {
    if (o.curve_server) throw std::invalid_argument(what + "a client socket takes curve_client keys");
    if (o.curve_client &&
        (!is_z85_key(o.curve_client->public_key) || !is_z85_key(o.curve_client->secret_key) ||
         !is_z85_key(o.curve_client->server_key)))
      throw std::invalid_argument(what + "CurveZMQ keys must be 40 Z85 characters each");
  }
}

}  // namespace troupe::transport
