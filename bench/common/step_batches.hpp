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
                                                  int64_t block_size = 16,
                                                  model::KvDtype kv_dtype = model::KvDtype::kFloat32);

// What such a step must do at least. FLOPs count 2 per multiply-add: every
// linear layer for every token and the LM head for each sampling row (the
// matrix products), attention's q.k and p.v over positions 0..p. Bytes:
// every weight once (wpe's one row left out), and the K and V of every
// cached position of every layer once per sequence.
struct StepWork {
  double matmul_flops = 0, attention_flops = 0;
  double weight_bytes = 0, kv_bytes = 0;
  double flops() const { return matmul_flops + attention_flops; }
};
StepWork step_work(const model::Gpt2Config& config, int64_t S, int64_t rows, int64_t ctx);

// The least time (ms) a step of that work takes on a machine with this FMA
// peak and streaming read bandwidth, run as Gpt2::forward_step runs it: each
// layer's attention between its q/k/v product and its output product, so the
// two never overlap. Each part takes at least the longer of its FLOPs at the
// peak and its bytes at the bandwidth (the matrix products: the weights;
// attention: the K/V), and the parts add up.
double step_bound_ms(const StepWork& work, double peak_gflops, double read_gbs);

}  // namespace troupe::bench
