#pragma once
// Engine: one worker's whole serving loop inside one process — the Scheduler
// (the batcher's core) driving a StepExecutor (the worker's core) step after
// step. `troupe batch` and `troupe generate --mode paged` run on it; the
// distributed system splits the same two cores across actors instead.
//
//   submit/cancel ──▶ Scheduler ──StepPlan──▶ StepExecutor (forward + sample)
//                         ▲                          │
//                         └──────StepResult──────────┘   take_events(): tokens, finishes
//
// Not thread-safe: one caller drives it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/request.hpp"
#include "actors/scheduler.hpp"

namespace troupe::model {
class Gpt2;
class PagedKvCache;
class StepExecutor;
class Tokenizer;
enum class PagedAttention;
}  // namespace troupe::model

namespace troupe::actors {

// Timing of the loop, accumulated over all steps.
struct EngineStats {
  int64_t steps = 0;             // steps executed (non-empty plans)
  double schedule_ms = 0.0;      // time in Scheduler::schedule + on_step_done
  double forward_ms = 0.0;       // time in the executor (model + sampling)
  double kv_utilization_sum = 0; // sum over steps of the scheduler's kv_utilization after planning
  double mean_kv_utilization() const { return steps ? kv_utilization_sum / steps : 0.0; }
};

class Engine {
 public:
  // `model`, `cache` and `tokenizer` must outlive the engine. options.num_blocks
  // and block_size must match the cache (std::invalid_argument otherwise).
  Engine(const model::Gpt2& model, model::PagedKvCache& cache, const model::Tokenizer* tokenizer,
         const SchedulerOptions& options, model::PagedAttention attention);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Why the request was refused, or nullopt when it is queued.
  std::optional<std::string> submit(Request request) { return scheduler_.submit(std::move(request)); }
  bool cancel(uint64_t id) { return scheduler_.cancel(id); }

  // Plans one step, runs it, feeds the result back. Returns false when there
  // was nothing to run (idle, or waiting requests that cannot be admitted).
  bool step();
  // Steps until every submitted request has finished.
  void run_until_idle();

  std::vector<RequestEvent> take_events() { return scheduler_.take_events(); }
  bool has_unfinished() const { return scheduler_.has_unfinished(); }
  const Scheduler& scheduler() const { return scheduler_; }
  const EngineStats& stats() const { return stats_; }

 private:
  Scheduler scheduler_;
  std::unique_ptr<model::StepExecutor> executor_;
  EngineStats stats_;
};

// "2GiB", "512MiB", "1.5G", "100000" (bytes) -> bytes. std::invalid_argument on junk.
int64_t parse_memory_size(const std::string& text);

}  // namespace troupe::actors
