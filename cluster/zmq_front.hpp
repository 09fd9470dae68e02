#pragma once
// The ZeroMQ front: what the head does with client frames (submit, cancel,
// status go to the router; anything else is answered with an error) and how
// the router's replies go back to a client's routing id. A client's id for
// the router is ClientId::zmq(its routing id).
#include <string>

#include "actors/router_actor.hpp"
#include "transport/socket_loop.hpp"

namespace troupe::cluster {

// The wire form of a router status report.
transport::StatusReply to_wire(const actors::StatusReport& report, int32_t max_queue);

// Sends the router's replies to a ZeroMQ client through `loop`'s `frontend`.
// A reply the loop refuses (its outbox stayed full, SocketLoop::send) is not
// dropped in silence: `unsent` is told the client, whose jobs then end.
actors::ClientSink zmq_client_sink(transport::SocketLoop& loop, transport::SocketId frontend,
                                   int32_t max_queue, std::function<void(const actors::ClientId& client)> unsent);

// On the loop thread: hands a client's message to the router.
void forward_client_message(transport::SocketLoop& loop, transport::SocketId frontend,
                            const actors::router_actor& router, const std::string& peer,
                            transport::Message&& message);

}  // namespace troupe::cluster
