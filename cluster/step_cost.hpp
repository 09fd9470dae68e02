#pragma once
// A worker's step-cost model for the batcher's step deadlines
// (core::StepCostModel): the cost model `troupe profile` fits (cluster/sim/
// cost_model.hpp), taken from the worker's own profile when it brought one
// (`troupe worker --cost-profile`, `--emulate`; `troupe serve --cost-profile`
// for local workers), else fitted the same way to the steps the worker has
// served, refitted as they accumulate (32, 64, 128, 256, 512 steps, then
// every 512, over the last 512).
//
// It predicts only where it knows: before a fit, or for a step of more tokens
// than any the fit has seen, it says "no prediction" (0) and the batcher
// allows the step its cold deadline instead of extrapolating a few decode
// steps' times to a long prefill.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/sim/cost_model.hpp"
#include "core/step_cost.hpp"

namespace troupe::cluster {

class FittedStepCost : public core::StepCostModel {
 public:
  // `profile`: a cost model measured for this worker; nullopt = fit one.
  explicit FittedStepCost(std::optional<sim::CostModel> profile = std::nullopt);

  int64_t predict_ns(const core::StepPlan& plan) override;
  void observe(uint64_t step_id, double forward_ms) override;

  // The model now (nullopt before the first fit, without a profile).
  const std::optional<sim::CostModel>& model() const { return model_; }
  int64_t largest_fitted_step() const { return largest_; }

 private:
  void refit();

  std::optional<sim::CostModel> model_;
  bool fitted_from_steps_;                                // no profile: refit as steps come
  int64_t largest_ = 0;                                   // tokens of the largest step the model knows
  std::unordered_map<uint64_t, sim::StepShape> planned_;  // steps in flight, by id
  std::vector<sim::CostSample> samples_;                  // a ring of the last kWindow served steps
  size_t next_ = 0;                                       // where the next sample goes in the ring
  uint64_t seen_ = 0;                                     // samples observed in all
  uint64_t next_fit_ = 32;                                // refit when seen_ reaches it
};

// The model for a worker that reports `cost_json` (WorkerInfo::cost: a cost
// model's JSON, "" = none). Throws std::runtime_error naming the field on a
// malformed one.
std::shared_ptr<core::StepCostModel> make_step_cost(const std::string& cost_json);

}  // namespace troupe::cluster
