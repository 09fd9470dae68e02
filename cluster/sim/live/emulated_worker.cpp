#include "cluster/sim/live/emulated_worker.hpp"

#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <thread>

#include "core/splitmix.hpp"

namespace troupe::cluster {

int32_t emulated_token(uint64_t seq_id, int32_t position, int32_t vocab_size, int32_t eos_id) {
  const uint64_t h = core::splitmix64(seq_id * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(position));
  auto t = static_cast<int32_t>(h % static_cast<uint64_t>(vocab_size));
  if (t == eos_id) t = (t + 1) % vocab_size;
  return t;
}

actors::StepRunner make_emulated_runner(const EmulatedWorkerConfig& config) {
  if (!(config.time_scale > 0)) throw std::invalid_argument("emulated worker: time_scale must be > 0");
  auto table = std::make_shared<core::SequenceTable>(config.table);
  return [table, config](const core::StepPlan& plan) {
    const auto start = std::chrono::steady_clock::now();
    core::PreparedStep step = table->prepare(plan);
    core::StepResult r;
    r.step_id = plan.step_id;
    r.failures = step.failures;
    for (const auto& c : step.chunks) {
      if (!c.score_ids.empty()) {
        // Prompt logprobs: made-up values (no model), the LM head's rows charged below.
        core::PromptScores& p = r.prompt_scores.emplace_back();
        p.seq_id = c.seq_id;
        p.start = c.start_pos + 1;
        for (int32_t id : c.score_ids) {
          core::SampledToken t{id, -std::log(static_cast<float>(config.table.vocab_size)), {}, 1};
          for (int32_t k = 0; k < c.sampling.prompt_logprobs; ++k)
            t.top.emplace_back((id + k) % config.table.vocab_size, t.logprob);
          p.tokens.push_back(std::move(t));
        }
      }
      if (!c.sample) continue;
      const int32_t pos = c.start_pos + static_cast<int32_t>(c.token_ids.size());
      r.outputs.push_back(
          {c.seq_id, {emulated_token(c.seq_id, pos, config.table.vocab_size, config.eos_id), 0.0f, {}, 0}});
    }
    table->commit(step, r.outputs, {});
    // The step takes what the model predicts for the work that really ran.
    core::StepPlan ran;
    for (const auto& c : step.chunks) {
      ran.work.push_back({c.seq_id, c.start_pos, static_cast<int32_t>(c.token_ids.size()), {}, c.sample,
                          static_cast<int32_t>(c.score_ids.size())});
    }
    const auto ns = static_cast<int64_t>(static_cast<double>(config.cost.predict_ns(ran)) * config.time_scale);
    std::this_thread::sleep_until(start + std::chrono::nanoseconds(ns));
    r.forward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return r;
  };
}

}  // namespace troupe::cluster
