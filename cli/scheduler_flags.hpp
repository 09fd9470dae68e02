#pragma once
// The scheduler flags shared by every command that schedules (batch, serve,
// worker, simulate): parsed once here into the core's option structs.
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "core/scheduler.hpp"

namespace troupe::model {
struct Gpt2Config;
enum class KvDtype;
}

namespace troupe::cli {

struct SchedulerFlags {
  int32_t max_num_seqs = 256;         // running sequences per worker at most
  int32_t max_batched_tokens = 2048;  // tokens per step (decodes + prompt chunks)
  int32_t block_size = 16;            // token slots per KV block
  std::string kv_memory = "2GiB";     // KV pool per worker
  int32_t num_blocks = 0;             // overrides kv_memory; 0 = from kv_memory
  bool no_prefix_caching = false;
  uint64_t seed = 0;  // base of the seeds for jobs that bring none
};

// Adds --max-num-seqs, --max-batched-tokens, --block-size, --kv-memory,
// --num-blocks, --no-prefix-caching and --seed to `app`.
void add_scheduler_flags(CLI::App& app, SchedulerFlags& flags);

// KV blocks per worker: --num-blocks, else what --kv-memory holds for the
// model with its KV stored as `kv_dtype`.
int32_t kv_blocks(const SchedulerFlags& flags, const model::Gpt2Config& config, model::KvDtype kv_dtype);

// The scheduler options of one worker serving `config`.
core::SchedulerOptions scheduler_options(const SchedulerFlags& flags, const model::Gpt2Config& config,
                                         model::KvDtype kv_dtype);

}  // namespace troupe::cli
