#include "cluster/step_cost.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace troupe::cluster {
namespace {

constexpr size_t kWindow = 512;  // served steps a fit uses, the newest

}  // namespace

FittedStepCost::FittedStepCost(std::optional<sim::CostModel> profile)
    : model_(std::move(profile)), fitted_from_steps_(!model_) {
  // A measured profile knows every step size: it predicts past its last knot
  // along its last segment, as the simulator uses it.
  if (model_) largest_ = INT64_MAX;
}

int64_t FittedStepCost::predict_ns(const core::StepPlan& plan) {
  const sim::StepShape shape = sim::StepShape::of(plan);
  if (fitted_from_steps_) {
    if (planned_.size() > 64) planned_.clear();  // results that never came (a step moved away)
    planned_[plan.step_id] = shape;
  }
  if (!model_ || shape.tokens > largest_) return 0;
  return model_->predict_ns(shape);
}

void FittedStepCost::observe(uint64_t step_id, double forward_ms) {
  if (!fitted_from_steps_) return;
  auto it = planned_.find(step_id);
  if (it == planned_.end()) return;
  const sim::CostSample sample{it->second, forward_ms * 1e6};
  planned_.erase(it);
  if (sample.ns <= 0 || sample.shape.tokens <= 0) return;
  if (samples_.size() < kWindow) {
    samples_.push_back(sample);
  } else {
    samples_[next_] = sample;
    next_ = (next_ + 1) % kWindow;
  }
  if (++seen_ >= next_fit_) {
    refit();
    next_fit_ = seen_ < kWindow ? 2 * seen_ : seen_ + kWindow;
  }
}

void FittedStepCost::refit() {
  int64_t largest = 1;
  for (const auto& s : samples_) largest = std::max(largest, s.shape.tokens);
  model_ = sim::CostModel::fit(sim::CostModel::knots_up_to(largest), samples_);
  largest_ = largest;
}

std::shared_ptr<core::StepCostModel> make_step_cost(const std::string& cost_json) {
  if (cost_json.empty()) return std::make_shared<FittedStepCost>();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(cost_json);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("cost model: not JSON: ") + e.what());
  }
  return std::make_shared<FittedStepCost>(sim::CostModel::from_json(j));
}

}  // namespace troupe::cluster
