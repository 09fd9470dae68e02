#include "actors/batcher_actor.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "core/failpoints.hpp"

namespace troupe::actors {
namespace {

// How often the step deadlines are checked: a hung worker is noticed this
// long after its deadline at most.
constexpr auto kWatchdogInterval = std::chrono::milliseconds(250);

struct BatcherState {
  std::unique_ptr<core::Batcher> core;
  std::map<uint64_t, worker_actor> workers;
  std::set<uint64_t> draining;  // workers told to drain: checked after each event until empty
  std::set<caf::actor_addr> watched;  // worker handles monitored (each once)
  router_actor router;
  caf::actor membership;  // hears of the workers the batcher lets go (may be unset)
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

// The worker is no longer the batcher's (the core has let it go already):
// forget its handle and tell membership why, so that its owner stops,
// restarts or resets it.
void let_go(Self self, uint64_t id, core::WorkerExit why, const std::string& detail) {
  auto& st = self->state;
  st.workers.erase(id);
  st.draining.erase(id);
  if (st.step_log) st.step_log->forget(id);
  if (st.membership) caf::anon_send(st.membership, wleft_atom::value, id, static_cast<int32_t>(why), detail);
}

// Sends the plans, forwards the events, retires drained workers and arms the
// deadline timer of requests that wait for a worker.
void dispatch(Self self, std::vector<core::Dispatch>& plans, int64_t now) {
  auto& st = self->state;
  for (core::Dispatch& d : plans) {
    auto it = st.workers.find(d.worker);
    if (it == st.workers.end()) continue;
    if (st.step_log) st.step_log->planned(d.worker, d.plan);
    self->send(it->second, plan_atom::value, d.worker, std::move(d.plan));
  }
  tell_router(self, st.core->take_events());
  std::vector<uint64_t> done;
  for (uint64_t id : st.draining)
    if (st.core->drained(id)) done.push_back(id);
  for (uint64_t id : done) {
    st.core->remove_worker(id, now, core::WorkerExit::kDrained);
    let_go(self, id, core::WorkerExit::kDrained, "drained");
  }
  if (!done.empty()) tell_worker_count(self);
  if (!st.timer_armed) {
    if (auto deadline = st.core->next_deadline()) {
      st.timer_armed = true;
      self->delayed_send(self, std::chrono::nanoseconds(std::max<int64_t>(0, *deadline - now) + 1),
                         tick_atom::value);
    }
  }
}

// After an event that touched one worker (a result, a request placed on it,
// a request ended there): plans only what can have changed — that worker,
// and any that takes a request waiting for one (core::Batcher::schedule(now,
// worker)). The head's cost per event does not grow with the workers.
void pump(Self self, uint64_t worker) {
  const int64_t now = now_ns(self);
  auto plans = self->state.core->schedule(now, worker);
  dispatch(self, plans, now);
}

// After an event that can touch every worker (one lost, one draining, a
// deadline): plans for all.
void pump_all(Self self) {
  const int64_t now = now_ns(self);
  auto plans = self->state.core->schedule(now);
  dispatch(self, plans, now);
}

void lose(Self self, uint64_t id) {
  auto& st = self->state;
  if (!st.workers.count(id)) return;
  st.core->remove_worker(id, now_ns(self), core::WorkerExit::kLost);
  st.workers.erase(id);
  st.draining.erase(id);
  if (st.step_log) st.step_log->forget(id);
  tell_worker_count(self);
  pump_all(self);
}

// The watchdog: workers past a step deadline are fenced, their requests
// move (core::Batcher::take_hung), and membership hears of it.
void watch(Self self) {
  auto& st = self->state;
  const auto hung = st.core->take_hung(now_ns(self));
  for (const core::HungWorker& h : hung) {
    const auto ms = [](int64_t ns) { return std::to_string(ns / 1'000'000) + " ms"; };
    let_go(self, h.worker, core::WorkerExit::kHung,
           "step " + std::to_string(h.step_id) + " ran " + ms(h.running_ns) + ", past its deadline of " +
               ms(h.deadline_ns));
  }
  if (!hung.empty()) {
    tell_worker_count(self);
    pump_all(self);
  }
  self->delayed_send(self, kWatchdogInterval, watch_atom::value);
}

// The failpoint `batcher.run`, at each job the batcher is given (and
// `batcher.result`, at each step result): sleep/hang stall it (the head's
// /health turns 503), spin makes it slower, error makes it throw (it dies;
// the head exits non-zero).
void failpoint(const char* name = "batcher.run") {
  const fail::Outcome f = TROUPE_FAILPOINT(name);
  if (f.action == fail::Action::kError) throw std::runtime_error(f.error);
}

batcher_actor::behavior_type batcher(Self self, core::BatcherOptions options,
                                     std::shared_ptr<core::StepLog> step_log) {
  self->state.core = std::make_unique<core::Batcher>(options);
  self->state.step_log = std::move(step_log);
  // A worker actor that dies is a lost worker. (Remote workers share one
  // handle, the gateway's: it is watched once, and its end loses them all.)
  self->set_down_handler([=](caf::down_msg& dm) {
    self->state.watched.erase(dm.source);
    std::vector<uint64_t> gone;
    for (const auto& [id, handle] : self->state.workers)
      if (handle.address() == dm.source) gone.push_back(id);
    for (uint64_t id : gone) lose(self, id);
  });
  if (options.step_timeout_floor_ns > 0) self->delayed_send(self, kWatchdogInterval, watch_atom::value);
  return {
      [=](listen_atom, router_actor router, caf::actor membership) {
        self->state.router = std::move(router);
        self->state.membership = std::move(membership);
        tell_worker_count(self);
      },
      [=](run_atom, core::Request& r) {
        failpoint();
        auto& st = self->state;
        const uint64_t id = r.id;
        if (auto err = st.core->submit(std::move(r), now_ns(self))) {
          core::RequestEvent ev;
          ev.request_id = id;
          ev.kind = core::EventKind::kFinished;
          ev.finish_reason = core::FinishReason::kError;
          ev.error = *err;
          tell_router(self, {std::move(ev)});
        }
        pump(self, st.core->worker_of(id));
      },
      [=](end_atom, uint64_t id, int32_t reason) {
        auto& st = self->state;
        const uint64_t worker = st.core->worker_of(id);
        st.core->finish(id, static_cast<core::FinishReason>(reason));
        pump(self, worker);
      },
      [=](result_atom, uint64_t worker, core::StepResult& result) {
        // A cost added to each result the head applies (spin: a slower head; sleep: a stalled one).
        failpoint("batcher.result");
        auto& st = self->state;
        if (st.step_log) st.step_log->done(worker, result);
        if (auto broken = st.core->on_result(worker, result, now_ns(self))) {
          // The core removed the worker and moved its requests.
          let_go(self, worker, core::WorkerExit::kBroken, *broken);
          tell_worker_count(self);
          return pump_all(self);
        }
        pump(self, worker);
      },
      [=](wjoin_atom, core::WorkerSpec& spec, worker_actor handle) -> std::string {
        auto& st = self->state;
        if (auto err = st.core->add_worker(spec)) return *err;
        if (st.watched.insert(handle.address()).second) self->monitor(handle);
        st.workers.emplace(spec.id, std::move(handle));
        tell_worker_count(self);
        pump(self, spec.id);
        return {};
      },
      [=](wlost_atom, uint64_t id) { lose(self, id); },
      [=](wdrain_atom, uint64_t id) {
        auto& st = self->state;
        if (!st.core->drain_worker(id)) return;
        st.draining.insert(id);
        pump_all(self);
      },
      [=](stats_atom) -> BatcherStatus {
        const auto& c = *self->state.core;
        return BatcherStatus{c.worker_stats(), c.num_waiting(), c.num_running(),
                             c.num_unplaced(), c.counters(),    true};
      },
      [=](tick_atom) {
        self->state.timer_armed = false;
        pump_all(self);
      },
      [=](watch_atom) { watch(self); },
  };
}

}  // namespace

batcher_actor spawn_batcher(caf::actor_system& system, const core::BatcherOptions& options,
                            std::shared_ptr<core::StepLog> step_log) {
  return system.spawn(batcher, options, std::move(step_log));
}

}  // namespace troupe::actors
