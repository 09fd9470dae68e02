#pragma once
// Flat batches of a fixed shape for benchmarks of Gpt2::forward_step, and a
// KV cache whose slots hold data (a never-written pool page reads as the
// kernel's shared zero page, which would flatter attention's memory traffic).
#include <cstdint>
#include <memory>

#include "model/config.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"

namespace troupe::bench {

// S sequences, each with `rows` new tokens ending at context `ctx`
// (positions ctx - rows .. ctx - 1), blocks of `block_size` laid out one
// sequence after another from block 0; every sequence samples its last row.
model::FlatBatch step_batch(int64_t S, int64_t rows, int64_t ctx, int64_t block_size = 16);

// A cache of `blocks` blocks, every slot filled with N(0, 1) values.
std::unique_ptr<model::PagedKvCache> filled_cache(const model::Gpt2Config& config, int64_t blocks,
                                                  int64_t block_size = 16);

// Floating-point operations of such a step (2 per multiply-add): every
// linear layer for every token, attention (q.k and p.v over positions
// 0..p) and the LM head for each sampling row.
double step_flops(const model::Gpt2Config& config, int64_t S, int64_t rows, int64_t ctx);

}  // namespace troupe::bench
