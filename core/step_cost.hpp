#pragma once
// StepCostModel: what one worker's steps should cost, asked by the batcher
// for each step's deadline (core/batcher.hpp, "step deadlines"). The core
// only asks; the models live above it (cluster/step_cost.hpp: the worker's
// `troupe profile` cost model, or one fitted to the steps it served), so the
// core needs no fitting code. One object per worker, driven by the batcher
// only (not thread-safe).
#include <cstdint>

#include "core/step_plan.hpp"

namespace troupe::core {

class StepCostModel {
 public:
  virtual ~StepCostModel() = default;
  // The predicted duration of `plan` on this worker, ns; 0 = no prediction
  // (yet). Called once per plan, when it is formed.
  virtual int64_t predict_ns(const StepPlan& plan) = 0;
  // The worker ran step `step_id` (a plan given to predict_ns) in
  // `forward_ms` by its own clock.
  virtual void observe(uint64_t step_id, double forward_ms) = 0;
};

}  // namespace troupe::core
