#include "actors/batcher_actor.hpp"

#include <chrono>
#include <map>
#include <memory>

namespace troupe::actors {
namespace {

struct BatcherState {
  std::unique_ptr<core::Batcher> core;
  std::map<uint64_t, worker_actor> workers;
  router_actor router;
  caf::actor membership;  // hears of drained workers (may be unset)
  bool timer_armed = false;
  std::shared_ptr<core::StepLog> step_log;  // may be unset
  static inline const char* name = "batcher";
};

using Self = batcher_actor::stateful_pointer<BatcherState>;

int64_t now_ns(Self self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

void tell_router(Self self, std::vector<core::RequestEvent> events) {
  if (events.empty() || !self->state.router) return;
  self->send(self->state.router, events_atom::value, std::move(events));
}

void tell_worker_count(Self self) {
  if (self->state.router) {
    self->send(self->state.router, workers_atom::value, static_cast<int32_t>(self->state.workers.size()));
  }
}

// Plans whatever can run now, sends it, forwards the events, retires drained
// workers and arms the deadline timer.
void pump(Self self) {
  auto& st = self->state;
  const int64_t now = now_ns(self);
  for (core::Dispatch& d : st.core->schedule(now)) {
    auto it = st.workers.find(d.worker);
    if (it == st.workers.end()) continue;
    if (st.step_log) st.step_log->planned(d.worker, d.plan);
    self->send(it->second, plan_atom::value, d.worker, std::move(d.plan));
  }
  tell_router(self, st.core->take_events());
  std::vector<uint64_t> done;
  for (const auto& ws : st.core->worker_stats()) {
    if (ws.state == core::WorkerState::kDraining && st.core->drained(ws.id)) done.push_back(ws.id);
  }
  for (uint64_t id : done) {
    st.core->remove_worker(id, now);
    st.workers.erase(id);
    if (st.membership) caf::anon_send(st.membership, drained_atom::value, id);
  }
  if (!done.empty()) tell_worker_count(self);
  if (auto deadline = st.core->next_deadline(); deadline && !st.timer_armed) {
    st.timer_armed = true;
    self->delayed_send(self, std::chrono::nanoseconds(std::max<int64_t>(0, *deadline - now) + 1),
                       tick_atom::value);
  }
}

void lose(Self self, uint64_t id) {
  auto& st = self->state;
  if (!st.workers.count(id)) return;
  st.core->remove_worker(id, now_ns(self));
  st.workers.erase(id);
  if (st.step_log) st.step_log->forget(id);
  tell_worker_count(self);
  pump(self);
}

batcher_actor::behavior_type batcher(Self self, core::BatcherOptions options,
                                     std::shared_ptr<core::StepLog> step_log) {
  self->state.core = std::make_unique<core::Batcher>(options);
  self->state.step_log = std::move(step_log);
  self->set_down_handler([=](caf::down_msg& dm) {
    for (const auto& [id, handle] : self->state.workers) {
      if (handle.address() == dm.source) {
        lose(self, id);
        return;
      }
    }
  });
  return {
      [=](listen_atom, router_actor router, caf::actor membership) {
        self->state.router = std::move(router);
        self->state.membership = std::move(membership);
        tell_worker_count(self);
      },
      [=](run_atom, core::Request& r) {
        const uint64_t id = r.id;
        if (auto err = self->state.core->submit(std::move(r), now_ns(self))) {
          core::RequestEvent ev;
          ev.request_id = id;
          ev.kind = core::EventKind::kFinished;
          ev.finish_reason = core::FinishReason::kError;
          ev.error = *err;
          tell_router(self, {std::move(ev)});
        }
        pump(self);
      },
      [=](end_atom, uint64_t id, int32_t reason) {
        self->state.core->finish(id, static_cast<core::FinishReason>(reason));
        pump(self);
      },
      [=](result_atom, uint64_t worker, core::StepResult& result) {
        auto& st = self->state;
        if (st.step_log) st.step_log->done(worker, result);
        if (auto broken = st.core->on_result(worker, result, now_ns(self))) {
          if (st.step_log) st.step_log->forget(worker);
          // The core removed the worker and moved its requests.
          if (auto it = st.workers.find(worker); it != st.workers.end()) {
            caf::anon_send_exit(it->second, caf::exit_reason::user_shutdown);
            st.workers.erase(it);
          }
          if (st.membership) caf::anon_send(st.membership, wlost_atom::value, worker, *broken);
          tell_worker_count(self);
        }
        pump(self);
      },
      [=](wjoin_atom, core::WorkerSpec& spec, worker_actor handle) -> std::string {
        auto& st = self->state;
        if (auto err = st.core->add_worker(spec)) return *err;
        self->monitor(handle);
        st.workers.emplace(spec.id, std::move(handle));
        tell_worker_count(self);
        pump(self);
        return {};
      },
      [=](wlost_atom, uint64_t id) { lose(self, id); },
      [=](wdrain_atom, uint64_t id) {
        self->state.core->drain_worker(id);
        pump(self);
      },
      [=](stats_atom) -> BatcherStatus {
        const auto& c = *self->state.core;
        return BatcherStatus{c.worker_stats(), c.num_waiting(), c.num_running(), c.num_unplaced()};
      },
      [=](tick_atom) {
        self->state.timer_armed = false;
        pump(self);
      },
  };
}

}  // namespace

batcher_actor spawn_batcher(caf::actor_system& system, const core::BatcherOptions& options,
                            std::shared_ptr<core::StepLog> step_log) {
  return system.spawn(batcher, options, std::move(step_log));
}

}  // namespace troupe::actors
