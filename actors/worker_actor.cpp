#include "actors/worker_actor.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>

#include "core/failpoints.hpp"

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;

struct WorkerState {
  StepRunner run;
  result_sink_actor sink;
  Clock::time_point last_done{};  // when the previous step's result left
  bool ran_before = false;
  std::shared_ptr<WorkerProgress> progress;  // may be unset
  static inline const char* name = "worker";
};

using Self = worker_actor::stateful_pointer<WorkerState>;

void finish_step(Self self) {
  auto& st = self->state;
  st.ran_before = true;
  st.last_done = Clock::now();
  if (st.progress) {
    st.progress->step_started_ns.store(0, std::memory_order_relaxed);
    st.progress->steps_done.fetch_add(1, std::memory_order_relaxed);
  }
}

worker_actor::behavior_type worker(Self self, WorkerParams params, result_sink_actor sink) {
  self->state.run = params.make_runner();  // on this actor's own thread
  self->state.sink = std::move(sink);
  self->state.progress = std::move(params.progress);
  return {
      [=](plan_atom, uint64_t worker_id, core::StepPlan& plan) {
        auto& st = self->state;
        const auto start = Clock::now();
        if (st.progress)
          st.progress->step_started_ns.store(std::max<int64_t>(1, start.time_since_epoch().count()),
                                             std::memory_order_relaxed);
        core::StepResult result;
        try {
          const fail::Outcome fp = TROUPE_FAILPOINT("worker.step");
          if (fp.action == fail::Action::kError) throw std::runtime_error(fp.error);
          result = st.run(plan);
          if (fp.action == fail::Action::kDrop) return finish_step(self);  // it ran; its result is lost
        } catch (const std::exception& e) {
          result = core::StepResult{};
          result.step_id = plan.step_id;
          result.error = e.what();
        }
        // Idle: the gap between the previous result leaving and this plan
        // starting (zero-ish when the batcher keeps a plan queued).
        result.idle_ms =
            st.ran_before ? std::chrono::duration<double, std::milli>(start - st.last_done).count() : 0.0;
        self->send(st.sink, result_atom::value, worker_id, std::move(result));
        finish_step(self);
      },
  };
}

}  // namespace

worker_actor spawn_worker(caf::actor_system& system, WorkerParams params, result_sink_actor sink) {
  if (!params.make_runner) throw std::invalid_argument("spawn_worker: make_runner is empty");
  if (params.detached) return system.spawn<caf::detached>(worker, std::move(params), std::move(sink));
  return system.spawn(worker, std::move(params), std::move(sink));
}

}  // namespace troupe::actors
