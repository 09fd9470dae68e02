#include "actors/engine.hpp"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "actors/router/output_text.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/step_executor.hpp"

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

const core::SchedulerOptions& fitted(const core::SchedulerOptions& o, const model::Gpt2& model,
                                     const model::PagedKvCache& cache) {
  const auto& cfg = model.config();
  auto bad = [](const std::string& what) { throw std::invalid_argument("engine options: " + what); };
  if (o.max_model_len > cfg.n_positions) {
    bad("max_model_len " + std::to_string(o.max_model_len) + " exceeds the model's n_positions " +
        std::to_string(cfg.n_positions));
  }
  if (o.vocab_size != cfg.vocab_size) {
    bad("vocab_size " + std::to_string(o.vocab_size) + " differs from the model's " +
        std::to_string(cfg.vocab_size));
  }
  if (o.eos_id >= cfg.vocab_size) bad("eos_id " + std::to_string(o.eos_id) + " is outside the vocabulary");
  if (o.num_blocks != cache.num_blocks() || o.block_size != cache.block_size()) {
    bad("the scheduler has " + std::to_string(o.num_blocks) + " blocks of " + std::to_string(o.block_size) +
        ", the KV cache " + std::to_string(cache.num_blocks()) + " of " + std::to_string(cache.block_size()));
  }
  return o;
}

}  // namespace

// A request's text and what decides it.
struct Engine::Text {
  std::unique_ptr<OutputText> out;  // null without a tokenizer
  bool ignore_eos = false;
};

Engine::Engine(const model::Gpt2& model, model::PagedKvCache& cache, const model::Tokenizer* tokenizer,
               const core::SchedulerOptions& options, model::PagedAttention attention)
    : scheduler_(fitted(options, model, cache)),
      tokenizer_(tokenizer),
      owned_executor_(std::make_unique<model::StepExecutor>(model, cache, attention)) {
  executor_ = [ex = owned_executor_.get()](const core::StepPlan& plan) { return ex->execute(plan); };
}

Engine::Engine(const core::SchedulerOptions& options, const model::Tokenizer* tokenizer, Executor executor)
    : scheduler_(options), tokenizer_(tokenizer), executor_(std::move(executor)) {}

Engine::~Engine() = default;

std::optional<std::string> Engine::submit(core::Request request, std::vector<std::string> stop) {
  const std::string who = "request " + std::to_string(request.id) + ": ";
  if (!stop.empty() && tokenizer_ == nullptr)
    return who + "stop strings need a tokenizer, and this engine has none";
  for (const auto& s : stop)
    if (s.empty()) return who + "stop strings must be non-empty";
  auto text = std::make_unique<Text>();
  text->ignore_eos = request.ignore_eos;
  if (tokenizer_ != nullptr) {
    text->out = std::make_unique<OutputText>(*tokenizer_, std::move(stop));
    for (int32_t id : request.output_ids) text->out->push(id);  // a resumed request's text so far
  }
  const uint64_t id = request.id;
  if (auto err = scheduler_.submit(std::move(request))) return err;
  texts_[id] = std::move(text);
  return std::nullopt;
}

bool Engine::cancel(uint64_t id) {
  const bool ok = scheduler_.cancel(id);
  if (ok) {
    auto events = scheduler_.take_events();
    process(events);
  }
  return ok;
}

void Engine::process(std::vector<core::RequestEvent>& events) {
  const int32_t eos = scheduler_.options().eos_id;
  while (!events.empty()) {
    for (auto& ev : events) {
      auto it = texts_.find(ev.request_id);
      Text* t = it != texts_.end() ? it->second.get() : nullptr;
      if (ev.kind == core::EventKind::kToken && t && t->out) {
        const bool shown = t->ignore_eos || ev.token_id != eos;
        if (shown) ev.text_delta = t->out->push(ev.token_id);
        if (t->out->stopped()) scheduler_.finish(ev.request_id, core::FinishReason::kStop);
      } else if (ev.kind == core::EventKind::kFinished) {
        if (t && t->out) {
          if (ev.finish_reason != core::FinishReason::kStop) ev.text_delta = t->out->flush();
          ev.text = t->out->text();
        }
        if (it != texts_.end()) texts_.erase(it);
      }
      ready_.push_back(std::move(ev));
    }
    events = scheduler_.take_events();  // the finishes of stop strings just matched
  }
}

bool Engine::step() {
  auto t0 = Clock::now();
  core::StepPlan plan = scheduler_.schedule();
  if (plan.empty()) return false;
  const double util = scheduler_.stats().kv_utilization;
  const double plan_ms = ms_since(t0);
  auto t1 = Clock::now();
  core::StepResult result;
  try {
    result = executor_(plan);
  } catch (const std::exception& e) {
    result = core::StepResult{};
    result.step_id = plan.step_id;
    result.error = e.what();
  }
  const double fwd_ms = ms_since(t1);
  auto t2 = Clock::now();
  scheduler_.on_step_done(result);
  auto events = scheduler_.take_events();
  process(events);
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

std::vector<core::RequestEvent> Engine::take_events() {
  auto pending = scheduler_.take_events();  // e.g. kScheduled from a step, finishes from finish()
  process(pending);
  std::vector<core::RequestEvent> out;
  out.swap(ready_);
  return out;
}

}  // namespace troupe::actors
