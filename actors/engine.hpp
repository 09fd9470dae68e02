#pragma once
// Engine: one worker's whole serving loop inside one process — the Scheduler
// (the batcher's core) driving a worker's StepExecutor step after step, and
// the requests' text (incremental detokenisation, stop strings) made from
// their tokens. `troupe batch` and `troupe generate --mode paged` run on it;
// the distributed system splits the same cores across actors instead.
//
//   submit/cancel ──▶ Scheduler ──StepPlan──▶ executor (forward + sample)
//                         ▲                          │
//                         └──────StepResult──────────┘   take_events(): tokens + text, finishes
//
// Not thread-safe: one caller drives it.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/memory_size.hpp"
#include "core/request.hpp"
#include "core/scheduler.hpp"

namespace troupe::model {
class Gpt2;
class PagedKvCache;
class StepExecutor;
class Tokenizer;
enum class PagedAttention;
}  // namespace troupe::model

namespace troupe::actors {

class OutputText;

// Timing of the loop, accumulated over all steps.
struct EngineStats {
  int64_t steps = 0;              // steps executed (non-empty plans)
  double schedule_ms = 0.0;       // time in Scheduler::schedule + on_step_done
  double forward_ms = 0.0;        // time in the executor (model + sampling)
  double kv_utilization_sum = 0;  // sum over steps of the scheduler's kv_utilization after planning
  double mean_kv_utilization() const { return steps ? kv_utilization_sum / steps : 0.0; }
};

class Engine {
 public:
  // Runs a plan on a worker. It should report failures in the result; an
  // exception fails the whole step the same way.
  using Executor = std::function<core::StepResult(const core::StepPlan&)>;

  // The real engine on `model` and `cache` (both must outlive it). Throws
  // std::invalid_argument, before any work, when the options do not fit the
  // model (max_model_len > n_positions, another vocabulary size, eos outside
  // it) or the cache (block size or count).
  Engine(const model::Gpt2& model, model::PagedKvCache& cache, const model::Tokenizer* tokenizer,
         const core::SchedulerOptions& options, model::PagedAttention attention);
  // Any executor (tests inject faults). `tokenizer` may be null (no text, no stop strings).
  Engine(const core::SchedulerOptions& options, const model::Tokenizer* tokenizer, Executor executor);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Why the request was refused, or nullopt when it is queued. `stop`: stop
  // strings (non-empty; they need a tokenizer): the text ends before the first
  // match and the request finishes with reason "stop".
  std::optional<std::string> submit(core::Request request, std::vector<std::string> stop = {});
  bool cancel(uint64_t id);

  // Plans one step, runs it, feeds the result back. Returns false when there
  // was nothing to run (idle, or waiting requests that cannot be admitted).
  bool step();
  // Steps until every submitted request has finished.
  void run_until_idle();

  // Events since the last call, with text_delta (and, on kFinished, text) set.
  std::vector<core::RequestEvent> take_events();
  bool has_unfinished() const { return scheduler_.has_unfinished(); }
  const core::Scheduler& scheduler() const { return scheduler_; }
  const EngineStats& stats() const { return stats_; }

 private:
  struct Text;
  void process(std::vector<core::RequestEvent>& events);

  core::Scheduler scheduler_;
  const model::Tokenizer* tokenizer_;
  std::unique_ptr<model::StepExecutor> owned_executor_;
  Executor executor_;
  std::unordered_map<uint64_t, std::unique_ptr<Text>> texts_;
  std::vector<core::RequestEvent> ready_;
  EngineStats stats_;
};

using core::parse_memory_size;  // (core/memory_size.hpp: torch-free, for `troupe simulate`)

}  // namespace troupe::actors
