#include "actors/worker_actor.hpp"

#include <chrono>
#include <memory>

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;

struct WorkerState {
  StepRunner run;
  result_sink_actor sink;
  Clock::time_point last_done{};  // when the previous step's result left
  bool ran_before = false;
  static inline const char* name = "worker";
};

worker_actor::behavior_type worker(worker_actor::stateful_pointer<WorkerState> self, WorkerParams params,
                                   result_sink_actor sink) {
  self->state.run = params.make_runner();  // on this actor's own thread
  self->state.sink = std::move(sink);
  return {
      [=](plan_atom, uint64_t worker_id, core::StepPlan& plan) {
        auto& st = self->state;
        const auto start = Clock::now();
        core::StepResult result;
        try {
          result = st.run(plan);
        } catch (const std::exception& e) {
          result = core::StepResult{};
          result.step_id = plan.step_id;
          result.error = e.what();
        }
        // Idle: the gap between the previous result leaving and this plan
        // starting (zero-ish when the batcher keeps a plan queued).
        result.idle_ms =
            st.ran_before ? std::chrono::duration<double, std::milli>(start - st.last_done).count() : 0.0;
        st.ran_before = true;
        self->send(st.sink, result_atom::value, worker_id, std::move(result));
        st.last_done = Clock::now();
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
