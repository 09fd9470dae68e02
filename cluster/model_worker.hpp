#pragma once
// A worker backed by the real model: the StepRunner a worker actor runs on
// its own thread (model::StepExecutor over its own PagedKvCache), and the
// facts a worker reports when it joins (its pool, its model's fingerprint).
// Workers of one device in one process share the weights (read-only); each
// has its own KV pool and its own thread budget.
#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "actors/worker_actor.hpp"
#include "core/scheduler.hpp"
#include "model/threading.hpp"

namespace troupe::model {
class Gpt2;
struct Gpt2Config;
enum class PagedAttention;
enum class KvDtype;  // paged_kv_cache.hpp
}  // namespace troupe::model

namespace troupe::cluster {

struct ModelWorkerConfig {
  std::shared_ptr<const model::Gpt2> model;  // shared by the workers of one device
  int32_t num_blocks = 0;                    // KV blocks in this worker's pool; >= 1
  int32_t block_size = 16;                   // token slots per block; >= 1
  model::ThreadBudget threads;               // applied on the worker's own thread
  model::KvDtype kv_dtype{};                 // the pool's storage (float32 unless set)
};

// Builds the runner: call on the worker's own thread (it applies the thread
// budget there and allocates the KV pool, untouched pages stay unmapped).
actors::StepRunner make_model_runner(const ModelWorkerConfig& config);

// KV blocks that fit `kv_memory` bytes ("2GiB") for `config` stored as
// `kv_dtype`; throws std::invalid_argument when not even one block fits.
int32_t blocks_for_kv_memory(const model::Gpt2Config& config, const std::string& kv_memory, int32_t block_size,
                             model::KvDtype kv_dtype);

}  // namespace troupe::cluster
