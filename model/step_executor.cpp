#include "model/step_executor.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>

#include "model/sampler.hpp"

namespace troupe::model {
namespace {

[[noreturn]] void bad(const StepPlan& plan, const SeqChunk& c, const std::string& what) {
  throw std::invalid_argument("step " + std::to_string(plan.step_id) + ", seq " + std::to_string(c.seq_id) +
                              ": " + what);
}

int64_t blocks_needed(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace

StepExecutor::StepExecutor(const Gpt2& model, PagedKvCache& cache, PagedAttention attention)
    : model_(model), cache_(cache), attention_(attention) {
  const Gpt2Config& cfg = model.config();
  if (cache.n_layer() != cfg.n_layer || cache.n_head() != cfg.n_head || cache.head_dim() != cfg.head_dim())
    throw std::invalid_argument("StepExecutor: the KV cache was made for a different model shape");
  if (cache.device() != model.device())
    throw std::invalid_argument("StepExecutor: the KV cache is on " + cache.device().str() + ", the model on " +
                                model.device().str());
}

void StepExecutor::validate(const StepPlan& plan) const {
  const Gpt2Config& cfg = model_.config();
  const int64_t bs = cache_.block_size();
  std::unordered_set<uint64_t> seen;
  std::unordered_map<int64_t, uint64_t> writer;  // slot -> seq_id writing it this step
  for (const SeqChunk& c : plan.seqs) {
    if (!seen.insert(c.seq_id).second) bad(plan, c, "appears twice in one step; merge its chunks");
    const int64_t n = static_cast<int64_t>(c.token_ids.size());
    if (n == 0) bad(plan, c, "chunk has no tokens");
    if (c.start_pos < 0) bad(plan, c, "start_pos " + std::to_string(c.start_pos) + " is negative");
    const int64_t end = c.start_pos + n;
    if (end > cfg.n_positions)
      bad(plan, c, "positions " + std::to_string(c.start_pos) + ".." + std::to_string(end - 1) +
                       " reach beyond n_positions = " + std::to_string(cfg.n_positions));
    for (int64_t i = 0; i < n; ++i)
      if (c.token_ids[i] < 0 || c.token_ids[i] >= cfg.vocab_size)
        bad(plan, c, "token " + std::to_string(c.token_ids[i]) + " at position " + std::to_string(c.start_pos + i) +
                         " is outside the vocabulary [0, " + std::to_string(cfg.vocab_size) + ")");
    const int64_t need = blocks_needed(end, bs);
    if (static_cast<int64_t>(c.block_table.size()) < need)
      bad(plan, c, "block table holds " + std::to_string(c.block_table.size()) + " blocks, " +
                       std::to_string(end) + " tokens need " + std::to_string(need) + " of " + std::to_string(bs));
    std::unordered_set<int32_t> own;
    for (int64_t b = 0; b < need; ++b) {
      if (c.block_table[b] < 0 || c.block_table[b] >= cache_.num_blocks())
        bad(plan, c, "block " + std::to_string(c.block_table[b]) + " (entry " + std::to_string(b) +
                         ") is outside the pool of " + std::to_string(cache_.num_blocks()) + " blocks");
      if (!own.insert(c.block_table[b]).second)
        bad(plan, c, "block table names block " + std::to_string(c.block_table[b]) + " twice");
    }
    for (int64_t p = c.start_pos; p < end; ++p) {
      const int64_t slot = static_cast<int64_t>(c.block_table[p / bs]) * bs + p % bs;
      const auto [it, fresh] = writer.emplace(slot, c.seq_id);
      if (!fresh)
        bad(plan, c, "writes KV slot " + std::to_string(slot) + " (block " + std::to_string(slot / bs) +
                         ") that seq " + std::to_string(it->second) + " also writes in this step");
    }
    if (c.sample) {
      try {
        model::validate(c.sampling);
      } catch (const std::invalid_argument& e) {
        bad(plan, c, e.what());
      }
    }
  }
}

FlatBatch StepExecutor::flatten(const StepPlan& plan) const {
  const int64_t bs = cache_.block_size();
  const int64_t T = plan.num_tokens(), S = static_cast<int64_t>(plan.seqs.size());
  int64_t max_blocks = 1;
  for (const SeqChunk& c : plan.seqs)
    max_blocks = std::max(max_blocks, blocks_needed(c.start_pos + static_cast<int64_t>(c.token_ids.size()), bs));
  // token ids, positions and slots in one [3, T] buffer: one allocation.
  at::Tensor idx = at::empty({3, T}, at::kLong);
  at::Tensor tables = at::zeros({S, max_blocks}, at::kInt);
  int64_t* ids = idx.data_ptr<int64_t>();
  int64_t* pos = ids + T;
  int64_t* slots = ids + 2 * T;
  int32_t* tp = tables.data_ptr<int32_t>();
  FlatBatch b;
  b.query_start.reserve(S + 1);
  b.context_lens.reserve(S);
  b.query_start.push_back(0);
  int64_t row = 0;
  for (int64_t s = 0; s < S; ++s) {
    const SeqChunk& c = plan.seqs[s];
    const int64_t n = static_cast<int64_t>(c.token_ids.size()), end = c.start_pos + n;
    for (int64_t i = 0; i < n; ++i, ++row) {
      const int64_t p = c.start_pos + i;
      ids[row] = c.token_ids[i];
      pos[row] = p;
      slots[row] = static_cast<int64_t>(c.block_table[p / bs]) * bs + p % bs;
    }
    const int64_t need = blocks_needed(end, bs);
    std::copy(c.block_table.begin(), c.block_table.begin() + need, tp + s * max_blocks);
    b.query_start.push_back(row);
    b.context_lens.push_back(end);
    if (c.sample) b.sample_rows.push_back(row - 1);
  }
  b.token_ids = idx[0];
  b.positions = idx[1];
  b.slot_mapping = idx[2];
  b.block_tables = tables;
  return b;
}

StepResult StepExecutor::execute(const StepPlan& plan) {
  const auto t0 = std::chrono::steady_clock::now();
  StepResult result;
  result.step_id = plan.step_id;
  if (plan.seqs.empty()) return result;
  validate(plan);
  const FlatBatch batch = flatten(plan);
  const at::Tensor logits = model_.forward_step(batch, cache_, attention_);
  std::vector<SamplingParams> params;
  std::vector<int64_t> positions;
  for (const SeqChunk& c : plan.seqs) {
    if (!c.sample) continue;
    params.push_back(c.sampling);
    positions.push_back(c.start_pos + static_cast<int64_t>(c.token_ids.size()));
    result.outputs.push_back(SeqOutput{c.seq_id, {}});
  }
  // Copying the logits to the CPU waits for the device, so the time below
  // covers the whole step.
  const std::vector<SampledToken> tokens = sample_rows(logits, params, positions);
  for (size_t i = 0; i < tokens.size(); ++i) result.outputs[i].token = tokens[i];
  result.forward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace troupe::model
