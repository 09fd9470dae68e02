#include "cluster/model_worker.hpp"

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "actors/engine.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/step_executor.hpp"

namespace troupe::cluster {

actors::StepRunner make_model_runner(const ModelWorkerConfig& config) {
  if (!config.model) throw std::invalid_argument("make_model_runner: no model");
  if (config.num_blocks < 1 || config.block_size < 1) {
    throw std::invalid_argument("make_model_runner: num_blocks and block_size must be >= 1");
  }
  model::apply_thread_budget(config.threads);
  // The runner owns the pool and the executor; the model is shared.
  struct Owned {
    std::shared_ptr<const model::Gpt2> model;
    model::PagedKvCache cache;
    model::StepExecutor executor;
    Owned(std::shared_ptr<const model::Gpt2> m, int32_t blocks, int32_t bs, model::KvDtype kv)
        : model(std::move(m)), cache(model->config(), blocks, bs, model->device(), kv), executor(*model, cache) {}
  };
  auto owned = std::make_shared<Owned>(config.model, config.num_blocks, config.block_size, config.kv_dtype);
  return [owned](const core::StepPlan& plan) { return owned->executor.execute(plan); };
}

int32_t blocks_for_kv_memory(const model::Gpt2Config& config, const std::string& kv_memory, int32_t block_size,
                             model::KvDtype kv_dtype) {
  const int64_t blocks =
      model::PagedKvCache::blocks_for_memory(config, actors::parse_memory_size(kv_memory), block_size, kv_dtype);
  if (blocks < 1) throw std::invalid_argument("--kv-memory " + kv_memory + " holds not even one KV block");
  return static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
}

}  // namespace troupe::cluster
