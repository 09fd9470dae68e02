#include "core/step_log.hpp"

#include <cstdio>
#include <fstream>

namespace troupe::core {

std::shared_ptr<StepLog> StepLog::to_file(const std::string& path) {
  auto file = std::make_shared<std::ofstream>(path, std::ios::trunc);
  if (!*file) return nullptr;
  return std::make_shared<StepLog>(std::move(file));
}

void StepLog::planned(uint64_t worker, const StepPlan& plan) {
  if (plan.work.empty()) return;
  std::vector<Item> items;
  items.reserve(plan.work.size());
  for (const SeqWork& w : plan.work) items.push_back({w.start_pos, w.num_tokens, w.sample});
  items_[{worker, plan.step_id}] = std::move(items);
}

void StepLog::done(uint64_t worker, const StepResult& result) {
  auto it = items_.find({worker, result.step_id});
  if (it == items_.end()) return;
  if (result.error.empty()) {
    *out_ << "{\"worker\":" << worker << ",\"step\":" << result.step_id << ",\"items\":[";
    for (size_t i = 0; i < it->second.size(); ++i) {
      const Item& x = it->second[i];
      *out_ << (i ? "," : "") << '[' << x.start << ',' << x.tokens << ',' << (x.sample ? 1 : 0) << ']';
    }
    char times[96];
    std::snprintf(times, sizeof times, "],\"ms\":%.4f,\"idle_ms\":%.4f}\n", result.forward_ms,
                  result.idle_ms);
    *out_ << times;
    out_->flush();  // a head stopped by a signal keeps every line written
  }
  items_.erase(it);
}

void StepLog::forget(uint64_t worker) {
  for (auto it = items_.begin(); it != items_.end();) {
    it = it->first.first == worker ? items_.erase(it) : std::next(it);
  }
}

}  // namespace troupe::core
