#pragma once
// The router actor: the front door's shell around RouterCore. Fronts (the
// ZeroMQ bridge, the HTTP server) send it jobs, cancels and "client gone";
// it sends requests and finishes to the batcher and every client message to
// the front's sink, which puts it on the client's connection.
//
//   front ──(submit, client, Job)──▶ router ──(run, Request)──▶ batcher
//   front ◀──sink(Reply)── router ◀──(events, RequestEvents)── batcher
#include <functional>
#include <string>

#include "actors/messages.hpp"

namespace troupe::model {
class Tokenizer;
}

namespace troupe::actors {

using router_actor = caf::typed_actor<
    caf::reacts_to<submit_atom, ClientId, Job>, caf::reacts_to<cancel_atom, ClientId, uint64_t>,
    caf::reacts_to<gone_atom, ClientId>, caf::reacts_to<events_atom, std::vector<core::RequestEvent>>,
    caf::reacts_to<workers_atom, int32_t>, caf::reacts_to<status_atom, ClientId>,
    caf::reacts_to<shutdown_atom>, caf::replies_to<idle_atom>::with<bool>,
    caf::replies_to<abort_atom, std::string>::with<int32_t>>;

// Delivers one message to one client; called on the router's thread, must
// be thread-safe with respect to the front's own thread (e.g. an outbox).
using ClientSink = std::function<void(const Reply&)>;

}  // namespace troupe::actors
