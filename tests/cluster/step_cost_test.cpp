// A worker's step-cost model for the step deadlines: fitted to the steps it
// served (as `troupe profile` fits), predicting only steps no larger than
// those it saw; or the profile the worker brought, from the start.
#include "cluster/step_cost.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace troupe::cluster {
namespace {

// A decode step of `n` sequences at position 10 each.
core::StepPlan decode_step(uint64_t id, int32_t n) {
  core::StepPlan p;
  p.step_id = id;
  for (int32_t i = 0; i < n; ++i) p.work.push_back({static_cast<uint64_t>(i + 1), 10, 1, {}, true});
  return p;
}

TEST(StepCost, FittedToServedStepsItPredictsOnlyWhatItSaw) {
  FittedStepCost cost;
  uint64_t id = 1;
  // 2 ms + 0.1 ms per sequence, steps of 1..16 sequences.
  for (int i = 0; i < 31; ++i, ++id) {
    const int32_t n = 1 + i % 16;
    EXPECT_EQ(cost.predict_ns(decode_step(id, n)), 0) << "no fit yet";
    cost.observe(id, 2.0 + 0.1 * n);
  }
  EXPECT_EQ(cost.predict_ns(decode_step(id, 4)), 0);
  cost.observe(id++, 2.4);  // the 32nd: the first fit
  ASSERT_TRUE(cost.model().has_value());
  EXPECT_EQ(cost.largest_fitted_step(), 16);
  const double predicted_ms = static_cast<double>(cost.predict_ns(decode_step(id++, 8))) / 1e6;
  EXPECT_NEAR(predicted_ms, 2.8, 0.3);
  EXPECT_EQ(cost.predict_ns(decode_step(id++, 64)), 0) << "larger than any step it fitted";
  cost.observe(12345, 99.0);  // a step it was never asked about: ignored
}

TEST(StepCost, AProfileThatCameWithTheWorkerPredictsFromTheStart) {
  sim::CostModel m;
  m.knots = {1, 64};
  m.knot_ns = {3e6, 5e6};
  auto cost = make_step_cost(m.to_json().dump());
  EXPECT_EQ(cost->predict_ns(decode_step(1, 1)), 3'000'000);
  EXPECT_GT(cost->predict_ns(decode_step(2, 4096)), 5'000'000) << "past its last knot: the last slope";
  EXPECT_THROW(make_step_cost("not json"), std::runtime_error);
  EXPECT_THROW(make_step_cost("{}"), std::runtime_error);
}

}  // namespace
}  // namespace troupe::cluster
