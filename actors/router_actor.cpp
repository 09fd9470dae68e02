#include "actors/router_actor.hpp"

#include <chrono>
#include <memory>

#include "actors/batcher_actor.hpp"
#include "model/text/tokenizer.hpp"

namespace troupe::actors {
namespace {

struct RouterState {
  std::unique_ptr<RouterCore> core;
  batcher_actor batcher;
  ClientSink sink;
  int64_t started_ns = 0;
  static inline const char* name = "router";
};

using Self = router_actor::stateful_pointer<RouterState>;

int64_t now_ns(Self self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

void flush(Self self, RouterOutput& out) {
  auto& st = self->state;
  for (auto& cmd : out.commands) {
    if (auto* r = std::get_if<core::Request>(&cmd)) {
      self->send(st.batcher, run_atom::value, std::move(*r));
    } else {
      const auto& f = std::get<FinishCommand>(cmd);
      self->send(st.batcher, end_atom::value, f.request_id, static_cast<int32_t>(f.reason));
    }
  }
  for (const Reply& reply : out.replies) st.sink(reply);
  out = RouterOutput{};
}

router_actor::behavior_type router(Self self, const model::Tokenizer* tokenizer, RouterOptions options,
                                   batcher_actor batcher, ClientSink sink) {
  auto& st = self->state;
  st.core = std::make_unique<RouterCore>(*tokenizer, options);
  st.batcher = std::move(batcher);
  st.sink = std::move(sink);
  st.started_ns = now_ns(self);
  return {
      [=](submit_atom, const ClientId& client, const Job& job) {
        RouterOutput out;
        self->state.core->on_submit(client, job, now_ns(self), out);
        flush(self, out);
      },
      [=](cancel_atom, const ClientId& client, uint64_t tag) {
        RouterOutput out;
        self->state.core->on_cancel(client, tag, now_ns(self), out);
        flush(self, out);
      },
      [=](gone_atom, const ClientId& client) {
        RouterOutput out;
        self->state.core->on_client_gone(client, out);
        flush(self, out);
      },
      [=](events_atom, const std::vector<core::RequestEvent>& events) {
        RouterOutput out;
        self->state.core->on_events(events, now_ns(self), out);
        flush(self, out);
      },
      [=](workers_atom, int32_t n) { self->state.core->set_workers(n); },
      [=](status_atom, const ClientId& client) {
        const double uptime = static_cast<double>(now_ns(self) - self->state.started_ns) / 1e9;
        self->request(self->state.batcher, std::chrono::seconds(5), stats_atom::value)
            .then(
                [=](BatcherStatus& bs) {
                  self->state.sink(
                      Reply{client, StatusReport{std::move(bs), self->state.core->stats(), uptime}});
                },
                [=](caf::error&) {
                  self->state.sink(
                      Reply{client, StatusReport{BatcherStatus{}, self->state.core->stats(), uptime}});
                });
      },
      [=](shutdown_atom) { self->state.core->begin_shutdown(); },
      [=](idle_atom) { return self->state.core->idle(); },
      [=](abort_atom, const std::string& why) {
        RouterOutput out;
        const size_t n = self->state.core->abort_all(why, now_ns(self), out);
        flush(self, out);
        return static_cast<int32_t>(n);
      },
  };
}

}  // namespace

router_actor spawn_router(caf::actor_system& system, const model::Tokenizer& tokenizer,
                          const RouterOptions& options, batcher_actor batcher, ClientSink sink) {
  return system.spawn(router, &tokenizer, options, std::move(batcher), std::move(sink));
}

}  // namespace troupe::actors
