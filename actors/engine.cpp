#include "actors/engine.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/step_executor.hpp"

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

Engine::Engine(const model::Gpt2& model, model::PagedKvCache& cache, const model::Tokenizer* tokenizer,
               const SchedulerOptions& options, model::PagedAttention attention)
    : scheduler_(options, tokenizer) {
  if (options.num_blocks != cache.num_blocks() || options.block_size != cache.block_size())
    throw std::invalid_argument("scheduler and KV cache disagree: scheduler has " +
                                std::to_string(options.num_blocks) + " blocks of " +
                                std::to_string(options.block_size) + ", the cache " +
                                std::to_string(cache.num_blocks()) + " of " + std::to_string(cache.block_size()));
  executor_ = std::make_unique<model::StepExecutor>(model, cache, attention);
}

Engine::~Engine() = default;

bool Engine::step() {
  auto t0 = Clock::now();
  model::StepPlan plan = scheduler_.schedule();
  if (plan.seqs.empty()) return false;
  double util = scheduler_.stats().kv_utilization;
  double plan_ms = ms_since(t0);
  auto t1 = Clock::now();
  model::StepResult result = executor_->execute(plan);
  double fwd_ms = ms_since(t1);
  auto t2 = Clock::now();
  scheduler_.on_step_done(result);
  stats_.schedule_ms += plan_ms + ms_since(t2);
  stats_.forward_ms += fwd_ms;
  stats_.kv_utilization_sum += util;
  ++stats_.steps;
  return true;
}

void Engine::run_until_idle() {
  while (scheduler_.has_unfinished()) {
    if (!step())
      throw std::logic_error("engine stalled: requests wait but none can be scheduled (KV pool too small?)");
  }
}

int64_t parse_memory_size(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("'" + text + "' is not a memory size (e.g. 2GiB, 512MiB, 100000)");
  }
  std::string unit = text.substr(pos);
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  if (mult == 0 || !std::isfinite(value) || value <= 0)
    throw std::invalid_argument("'" + text + "' is not a memory size (e.g. 2GiB, 512MiB, 100000)");
  double bytes = value * mult;
  if (bytes > 9e18) throw std::invalid_argument("memory size '" + text + "' is too large");
  return static_cast<int64_t>(bytes);
}

}  // namespace troupe::actors
