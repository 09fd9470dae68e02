#include "model/step_executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>

#include "model/sampler.hpp"

namespace troupe::model {
namespace {

[[noreturn]] void bad(const core::SeqChunk& c, const std::string& what) {
  throw std::invalid_argument("seq " + std::to_string(c.seq_id) + ": " + what);
}

int64_t blocks_needed(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

core::SequenceTableOptions table_options(const Gpt2& model, const PagedKvCache& cache) {
  core::SequenceTableOptions o;
  o.num_blocks = static_cast<int32_t>(cache.num_blocks());
  o.block_size = static_cast<int32_t>(cache.block_size());
  o.max_positions = model.config().n_positions;
  o.vocab_size = model.config().vocab_size;
  return o;
}

}  // namespace

StepExecutor::StepExecutor(const Gpt2& model, PagedKvCache& cache, PagedAttention attention)
    : model_(model),
      cache_(cache),
      attention_(attention),
      table_(table_options(model, cache)),
      heap_trim_(core::HeapTrimPolicy::min_tokens_from(std::getenv("TROUPE_HEAP_TRIM"))) {
  const Gpt2Config& cfg = model.config();
  if (cache.n_layer() != cfg.n_layer || cache.n_head() != cfg.n_head || cache.head_dim() != cfg.head_dim())
    throw std::invalid_argument("StepExecutor: the KV cache was made for a different model shape");
  if (cache.device() != model.device())
    throw std::invalid_argument("StepExecutor: the KV cache is on " + cache.device().str() +
                                ", the model on " + model.device().str());
  set_kv_prefault(kv_prefault_mode());
}

void StepExecutor::set_kv_prefault(KvPrefault mode) {
  prefault_ = mode == KvPrefault::kAhead;
  if (mode == KvPrefault::kWhole) cache_.map_whole();
}

void StepExecutor::validate(const std::vector<core::SeqChunk>& chunks) const {
  const Gpt2Config& cfg = model_.config();
  const int64_t bs = cache_.block_size();
  std::unordered_set<uint64_t> seen;
  std::unordered_map<int64_t, uint64_t> writer;  // slot -> seq_id writing it this step
  for (const core::SeqChunk& c : chunks) {
    if (!seen.insert(c.seq_id).second) bad(c, "appears twice in one step; merge its chunks");
    const int64_t n = static_cast<int64_t>(c.token_ids.size());
    if (n == 0) bad(c, "chunk has no tokens");
    if (c.start_pos < 0) bad(c, "start_pos " + std::to_string(c.start_pos) + " is negative");
    const int64_t end = c.start_pos + n;
    if (end > cfg.n_positions)
      bad(c, "positions " + std::to_string(c.start_pos) + ".." + std::to_string(end - 1) +
                 " reach beyond n_positions = " + std::to_string(cfg.n_positions));
    for (int64_t i = 0; i < n; ++i)
      if (c.token_ids[i] < 0 || c.token_ids[i] >= cfg.vocab_size)
        bad(c, "token " + std::to_string(c.token_ids[i]) + " at position " + std::to_string(c.start_pos + i) +
                   " is outside the vocabulary [0, " + std::to_string(cfg.vocab_size) + ")");
    const int64_t need = blocks_needed(end, bs);
    if (static_cast<int64_t>(c.block_table.size()) < need)
      bad(c, "block table holds " + std::to_string(c.block_table.size()) + " blocks, " + std::to_string(end) +
                 " tokens need " + std::to_string(need) + " of " + std::to_string(bs));
    std::unordered_set<int32_t> own;
    for (int64_t b = 0; b < need; ++b) {
      if (c.block_table[b] < 0 || c.block_table[b] >= cache_.num_blocks())
        bad(c, "block " + std::to_string(c.block_table[b]) + " (entry " + std::to_string(b) +
                   ") is outside the pool of " + std::to_string(cache_.num_blocks()) + " blocks");
      if (!own.insert(c.block_table[b]).second)
        bad(c, "block table names block " + std::to_string(c.block_table[b]) + " twice");
    }
    for (int64_t p = c.start_pos; p < end; ++p) {
      const int64_t slot = static_cast<int64_t>(c.block_table[p / bs]) * bs + p % bs;
      const auto [it, fresh] = writer.emplace(slot, c.seq_id);
      if (!fresh)
        bad(c, "writes KV slot " + std::to_string(slot) + " (block " + std::to_string(slot / bs) +
                   ") that seq " + std::to_string(it->second) + " also writes in this step");
    }
    if (static_cast<int64_t>(c.score_ids.size()) > n)
      bad(c, "scores " + std::to_string(c.score_ids.size()) + " prompt tokens with " + std::to_string(n) + " rows");
    for (int32_t id : c.score_ids)
      if (id < 0 || id >= cfg.vocab_size) bad(c, "scores token " + std::to_string(id) + ", outside the vocabulary");
    if (!c.score_ids.empty() && (c.sampling.prompt_logprobs < 0 || c.sampling.prompt_logprobs > core::kMaxLogprobs))
      bad(c, "scores prompt tokens with prompt_logprobs " + std::to_string(c.sampling.prompt_logprobs));
    if (c.sample) {
      try {
        core::validate(c.sampling);
      } catch (const std::invalid_argument& e) {
        bad(c, e.what());
      }
    }
  }
}

FlatBatch StepExecutor::flatten(const std::vector<core::SeqChunk>& chunks) const {
  const int64_t bs = cache_.block_size();
  int64_t T = 0;
  for (const core::SeqChunk& c : chunks) T += static_cast<int64_t>(c.token_ids.size());
  const int64_t S = static_cast<int64_t>(chunks.size());
  int64_t max_blocks = 1;
  for (const core::SeqChunk& c : chunks)
    max_blocks =
        std::max(max_blocks, blocks_needed(c.start_pos + static_cast<int64_t>(c.token_ids.size()), bs));
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
    const core::SeqChunk& c = chunks[s];
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

std::vector<core::SeqOutput> StepExecutor::run(const std::vector<core::SeqChunk>& chunks,
                                               std::vector<core::SeqFailure>& failures,
                                               std::vector<core::PromptScores>& scores) {
  std::vector<core::SeqOutput> outputs;
  if (chunks.empty()) return outputs;
  validate(chunks);
  FlatBatch batch = flatten(chunks);
  // The rows the LM head runs on: each sampling chunk's last (flatten's
  // sample_rows), then the rows that score prompt tokens, chunk by chunk.
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  std::vector<int32_t> score_ids, score_top;
  std::vector<size_t> score_chunk;  // chunk of each score row
  int64_t row0 = 0;
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const core::SeqChunk& c = chunks[ci];
    for (size_t i = 0; i < c.score_ids.size(); ++i) {
      batch.sample_rows.push_back(row0 + static_cast<int64_t>(i));
      score_ids.push_back(c.score_ids[i]);
      score_top.push_back(c.sampling.prompt_logprobs);
      score_chunk.push_back(ci);
    }
    row0 += static_cast<int64_t>(c.token_ids.size());
  }
  const at::Tensor hidden = model_.forward_step_hidden(batch, cache_, attention_);

  // Prompt scores, a block of rows at a time: a long prompt chunk's logits
  // never exist whole ([128, 50257] fp32 is 25 MiB, under the heap's 32 MiB
  // mmap threshold). A row that cannot be scored (NaN) fails its sequence.
  std::vector<bool> failed(chunks.size(), false);
  std::vector<core::SampledToken> scored(score_ids.size());
  const auto n_score = static_cast<int64_t>(score_ids.size());
  for (int64_t b0 = 0; b0 < n_score; b0 += score_rows_per_call_) {
    const int64_t m = std::min(score_rows_per_call_, n_score - b0);
    const at::Tensor logits = model_.lm_head(hidden.narrow(0, n_sample + b0, m));
    const std::vector<int32_t> ids(score_ids.begin() + b0, score_ids.begin() + b0 + m);
    const std::vector<int32_t> top(score_top.begin() + b0, score_top.begin() + b0 + m);
    try {
      std::vector<core::SampledToken> block = score_rows(logits, ids, top);
      std::move(block.begin(), block.end(), scored.begin() + b0);
    } catch (const std::runtime_error&) {
      const at::Tensor cpu = logits.to(at::kCPU, at::kFloat).contiguous();
      const int64_t vocab = cpu.size(1);
      for (int64_t r = 0; r < m; ++r) {
        const size_t ci = score_chunk[b0 + r];
        try {
          scored[b0 + r] = score(cpu.data_ptr<float>() + r * vocab, vocab, ids[r], top[r]);
        } catch (const std::runtime_error& e) {
          if (!failed[ci])
            failures.push_back({chunks[ci].seq_id, "seq " + std::to_string(chunks[ci].seq_id) + ": " + e.what(), false});
          failed[ci] = true;
        }
      }
    }
  }
  for (int64_t r = 0; r < n_score;) {
    const size_t ci = score_chunk[r];
    const auto k = static_cast<int64_t>(chunks[ci].score_ids.size());
    if (!failed[ci]) {
      core::PromptScores& p = scores.emplace_back();
      p.seq_id = chunks[ci].seq_id;
      p.start = chunks[ci].start_pos + 1;
      p.tokens.assign(std::make_move_iterator(scored.begin() + r), std::make_move_iterator(scored.begin() + r + k));
    }
    r += k;
  }

  std::vector<SamplingParams> params;
  std::vector<int64_t> positions;
  std::vector<uint64_t> ids;
  std::vector<History> history;
  std::vector<int64_t> keep;  // sample rows of sequences whose scoring did not fail
  for (size_t ci = 0, r = 0; ci < chunks.size(); ++ci) {
    const core::SeqChunk& c = chunks[ci];
    if (!c.sample) continue;
    const auto row = static_cast<int64_t>(r++);
    if (failed[ci]) continue;
    keep.push_back(row);
    params.push_back(c.sampling);
    positions.push_back(c.start_pos + static_cast<int64_t>(c.token_ids.size()));
    ids.push_back(c.seq_id);
    history.emplace_back(c.history, static_cast<size_t>(c.history_prompt));
  }
  if (ids.empty()) return outputs;
  at::Tensor logits = model_.lm_head(hidden.narrow(0, 0, n_sample));
  if (static_cast<int64_t>(keep.size()) != n_sample) logits = logits.index_select(0, torch::tensor(keep).to(logits.device()));
  // Copying the logits to the CPU waits for the device, so the time of the
  // step covers the whole forward pass.
  std::vector<core::SampledToken> tokens;
  try {
    tokens = sample_rows(logits, params, positions, history);
  } catch (const std::runtime_error&) {
    // A row that cannot be sampled (NaN or +inf logits) fails its sequence
    // only: sample the rows one by one to find it.
    const at::Tensor cpu = logits.to(at::kCPU, at::kFloat).contiguous();
    const int64_t vocab = cpu.size(1);
    for (size_t r = 0; r < ids.size(); ++r) {
      try {
        core::SampledToken t = sample(cpu.data_ptr<float>() + static_cast<int64_t>(r) * vocab, vocab,
                                      params[r], positions[r], history[r]);
        outputs.push_back({ids[r], std::move(t)});
      } catch (const std::runtime_error& e) {
        failures.push_back({ids[r], "seq " + std::to_string(ids[r]) + ": " + e.what(), false});
      }
    }
    return outputs;
  }
  for (size_t i = 0; i < tokens.size(); ++i) outputs.push_back({ids[i], std::move(tokens[i])});
  return outputs;
}

core::StepResult StepExecutor::execute(const core::StepPlan& plan) {
  const auto t0 = std::chrono::steady_clock::now();
  core::StepResult result;
  result.step_id = plan.step_id;
  core::PreparedStep step = table_.prepare(plan);
  int64_t tokens = 0, highest = -1;  // the highest block this step writes K/V into
  const int64_t bs = cache_.block_size();
  for (const auto& c : step.chunks) {
    const auto n = static_cast<int64_t>(c.token_ids.size());
    tokens += n;
    const int64_t last =
        n > 0 ? std::min<int64_t>((c.start_pos + n - 1) / bs + 1, static_cast<int64_t>(c.block_table.size()))
              : 0;
    for (int64_t b = std::max<int64_t>(c.start_pos, 0) / bs; b < last; ++b)
      highest = std::max<int64_t>(highest, std::min<int64_t>(c.block_table[b], cache_.num_blocks() - 1));
  }
  // Mapped ahead on the cache's thread while this step runs (kv_prefault.hpp);
  // a step that writes no block asks for nothing (an idle worker holds no pool pages).
  if (prefault_ && highest >= 0) cache_.map_ahead(highest);
  // The step after a large one gives the memory back: before its forward
  // pass, the heap's free pages (the large step's activations, now free); the
  // kernels' scratch at their first call in it; after it, the heap's free
  // pages again (that scratch). Twice because glibc's malloc_trim leaves the
  // top of a thread's arena alone, and what this step frees there joins it.
  const bool give_back = heap_trim_.before_step(tokens);
  if (give_back) {
    core::release_free_heap();
    release_kernel_scratch();
    ++heap_releases_;
  }
  std::vector<core::SeqFailure> row_failures;
  try {
    result.outputs = run(step.chunks, row_failures, result.prompt_scores);
  } catch (const std::exception& e) {
    if (give_back) core::release_free_heap();
    table_.abort(step);
    result.prompt_scores.clear();
    result.error = e.what();
    result.forward_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return result;
  }
  std::vector<uint64_t> failed;
  for (const auto& f : row_failures) failed.push_back(f.seq_id);
  table_.commit(step, result.outputs, failed);
  result.failures = std::move(step.failures);
  result.failures.insert(result.failures.end(), row_failures.begin(), row_failures.end());
  if (give_back) core::release_free_heap();
  result.forward_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace troupe::model
