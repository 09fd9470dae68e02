#include "common/step_batches.hpp"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>

namespace troupe::bench {

model::FlatBatch step_batch(int64_t S, int64_t rows, int64_t ctx, int64_t block_size) {
  const int64_t blocks_per_seq = (ctx + block_size - 1) / block_size;
  std::vector<int64_t> tok, pos, slot, qs{0}, ctxs, sample;
  torch::Tensor tables = torch::empty({S, blocks_per_seq}, torch::kInt);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < blocks_per_seq; ++b) tables[s][b] = static_cast<int32_t>(s * blocks_per_seq + b);
    for (int64_t p = ctx - rows; p < ctx; ++p) {
      tok.push_back((s * 7919 + p * 104729) % 50000);
      pos.push_back(p);
      slot.push_back((s * blocks_per_seq + p / block_size) * block_size + p % block_size);
    }
    qs.push_back(static_cast<int64_t>(tok.size()));
    ctxs.push_back(ctx);
    sample.push_back(qs.back() - 1);
  }
  model::FlatBatch b;
  b.token_ids = torch::tensor(tok, torch::kLong);
  b.positions = torch::tensor(pos, torch::kLong);
  b.slot_mapping = torch::tensor(slot, torch::kLong);
  b.query_start = qs;
  b.context_lens = ctxs;
  b.block_tables = tables;
  b.sample_rows = sample;
  return b;
}

std::unique_ptr<model::PagedKvCache> filled_cache(const model::Gpt2Config& config, int64_t blocks,
                                                  int64_t block_size, model::KvDtype kv_dtype) {
  auto c = std::make_unique<model::PagedKvCache>(config, blocks, block_size, torch::kCPU, kv_dtype);
  for (int l = 0; l < config.n_layer; ++l) {
    c->k(l).copy_(torch::randn(c->k(l).sizes()));
    c->v(l).copy_(torch::randn(c->v(l).sizes()));
  }
  return c;
}

StepWork step_work(const model::Gpt2Config& c, int64_t S, int64_t rows, int64_t ctx) {
  const double E = c.n_embd, L = c.n_layer;
  const double linear = L * (E * 3 * E + E * E + E * 4 * E + 4 * E * E);
  double attention = 0;
  for (int64_t p = ctx - rows; p < ctx; ++p) attention += L * 2.0 * (p + 1) * E * 2;
  StepWork w;
  w.matmul_flops = S * (rows * 2.0 * linear + 2.0 * E * c.vocab_size);
  w.attention_flops = S * attention;
  // Per layer: the four matrices, their biases (3E, E, 4E, E) and two LayerNorms (4E); then wte and ln_f.
  const double per_layer = linear / L + 3 * E + E + 4 * E + E + 4 * E;
  w.weight_bytes = 4.0 * (L * per_layer + c.vocab_size * E + 2 * E);
  w.kv_bytes = 4.0 * S * L * 2 * ctx * E;
  return w;
}

double step_bound_ms(const StepWork& w, double peak_gflops, double read_gbs) {
  const double matmul_s = std::max(w.matmul_flops / (peak_gflops * 1e9), w.weight_bytes / (read_gbs * 1e9));
  const double attention_s = std::max(w.attention_flops / (peak_gflops * 1e9), w.kv_bytes / (read_gbs * 1e9));
  return (matmul_s + attention_s) * 1e3;
}

}  // namespace troupe::bench
