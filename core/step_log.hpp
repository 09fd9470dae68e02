#pragma once
// StepLog: the steps a head's workers ran, one JSON line each, so that a cost
// model can be calibrated against real service (`troupe serve --step-log
// FILE`, then `troupe profile --refit COST --calibrate-with FILE`):
//
//   {"worker":1,"step":7,"items":[[start_pos,num_tokens,sample],...],"ms":12.31,"idle_ms":0.02}
//
// `ms` is the worker's own time for the step (StepResult::forward_ms: the
// engine, as served: on CPUs shared with the head and its clients, with the
// next plan arriving while it runs). Steps that failed are not written. The
// plan is remembered when it is sent and written when its result comes back.
// Not thread-safe: the batcher actor owns it.
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/step_plan.hpp"

namespace troupe::core {

class StepLog {
 public:
  // Owns the stream: the actor that writes may outlive whoever opened it.
  explicit StepLog(std::shared_ptr<std::ostream> out) : out_(std::move(out)) {}
  // A log written to the file at `path` (emptied first); nullptr when it
  // cannot be written (the caller says so in its own terms).
  static std::shared_ptr<StepLog> to_file(const std::string& path);
  void planned(uint64_t worker, const StepPlan& plan);
  void done(uint64_t worker, const StepResult& result);
  // Plans of a worker that is gone (their results will never come).
  void forget(uint64_t worker);
  size_t pending() const { return items_.size(); }

 private:
  struct Item {
    int32_t start, tokens;
    bool sample;
  };
  std::shared_ptr<std::ostream> out_;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<Item>> items_;  // (worker, step id) -> its work
};

}  // namespace troupe::core
