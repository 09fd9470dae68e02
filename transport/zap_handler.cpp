#include "transport/zap_handler.hpp"

#include <stdexcept>

#include <zmq.h>

namespace troupe::transport {
namespace {

std::string z85(const std::string& binary) {
  char text[41] = {};
  if (binary.size() != 32 || !zmq_z85_encode(text, reinterpret_cast<const uint8_t*>(binary.data()), 32))
    return "";
  return text;
}

}  // namespace

void ZapHandler::allow(const std::string& domain, const std::vector<std::string>& z85_keys) {
  Domain d{domain, {}};
  for (const std::string& key : z85_keys) {
    uint8_t binary[32];
    if (key.size() != 40 || !zmq_z85_decode(binary, key.c_str()))
      throw std::invalid_argument("an allowed CurveZMQ key is not 40 Z85 characters: \"" + key + "\"");
    d.keys.insert(std::string(reinterpret_cast<const char*>(binary), 32));
  }
  domains_.push_back(std::move(d));
}

ZapHandler::Decision ZapHandler::decide(const std::vector<std::string>& request) const {
  Decision d;
  if (request.size() < 6 || request[0] != "1.0") {
    d.status = "500";
    d.reason = "unreadable ZAP request";
    return d;
  }
  const std::string& domain = request[2];
  const std::string& mechanism = request[5];
  d.address = request[3];
  const Domain* known = nullptr;
  for (const Domain& dom : domains_)
    if (dom.name == domain) known = &dom;
  d.status = "400";
  if (mechanism == "CURVE") {
    if (request.size() < 7 || request[6].size() != 32) {
      d.reason = "no CURVE client key";
    } else {
      d.client_key = z85(request[6]);
      if (!known)
        d.reason = "no allowed keys for ZAP domain \"" + domain + "\"";
      else if (!known->keys.count(request[6]))
        d.reason = "client key not allowed";
      else
        d.accepted = true;
    }
  } else if (mechanism == "NULL" && !known) {
    d.accepted = true;  // a socket without CurveZMQ (libzmq asks only when a domain is set)
  } else {
    d.reason = "mechanism " + mechanism + " is not accepted here";
  }
  if (d.accepted) {
    d.status = "200";
    d.reason = "OK";
  }
  return d;
}

std::vector<std::string> ZapHandler::reply(const std::vector<std::string>& request,
                                           const Decision& decision) {
  const std::string id = request.size() > 1 ? request[1] : "";
  return {"1.0", id, decision.status, decision.reason, decision.accepted ? decision.client_key : "", ""};
}

}  // namespace troupe::transport
