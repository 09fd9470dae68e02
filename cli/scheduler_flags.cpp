#include "cli/scheduler_flags.hpp"

#include "cli/command.hpp"

#include "cluster/model_worker.hpp"
#include "model/config.hpp"

namespace troupe::cli {

void add_scheduler_flags(CLI::App& app, SchedulerFlags& f) {
  app.add_option("--max-num-seqs", f.max_num_seqs, "Running sequences per step at most (per worker)")
      ->check(positive_number());
  app.add_option("--max-batched-tokens", f.max_batched_tokens,
                 "Tokens per step at most (decodes + prompt chunks)")
      ->check(positive_number());
  app.add_option("--block-size", f.block_size, "Token slots per KV block")->check(CLI::Range(1, 1024));
  app.add_option("--kv-memory", f.kv_memory, "KV cache memory per worker, e.g. 2GiB, 512MiB");
  app.add_option("--num-blocks", f.num_blocks, "KV blocks per worker (overrides --kv-memory)")
      ->check(positive_number());
  app.add_flag("--no-prefix-caching", f.no_prefix_caching, "Do not share KV blocks between equal prefixes");
  app.add_option("--seed", f.seed, "Base seed for jobs that give none");
}

int32_t kv_blocks(const SchedulerFlags& f, const model::Gpt2Config& config, model::KvDtype kv_dtype) {
  return f.num_blocks > 0 ? f.num_blocks
                          : cluster::blocks_for_kv_memory(config, f.kv_memory, f.block_size, kv_dtype);
}

core::SchedulerOptions scheduler_options(const SchedulerFlags& f, const model::Gpt2Config& config,
                                         model::KvDtype kv_dtype) {
  core::SchedulerOptions so;
  so.block_size = f.block_size;
  so.num_blocks = kv_blocks(f, config, kv_dtype);
  so.max_num_seqs = f.max_num_seqs;
  so.max_num_batched_tokens = f.max_batched_tokens;
  so.max_model_len = config.n_positions;
  so.vocab_size = config.vocab_size;
  so.eos_id = config.eos_token_id;
  so.enable_prefix_caching = !f.no_prefix_caching;
  so.seed = f.seed;
  return so;
}

}  // namespace troupe::cli
