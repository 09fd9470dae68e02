#include "core/sequence_table.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace troupe::core {
namespace {

int64_t blocks_needed(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace

struct SequenceTable::Scratch {
  // Slots [lo, hi) of one block that `seq` writes in the step being
  // prepared; `next`: the block's next range in writes, -1 at the end.
  // (Constructors, so that emplace_back writes the fields in place: a
  // braced temporary was built on the stack by narrow stores and copied by
  // one wide load, which the store buffer cannot forward: a stall each.)
  struct WriteRange {
    WriteRange(uint64_t s, int32_t l, int32_t h, int32_t n) : seq(s), lo(l), hi(h), next(n) {}
    uint64_t seq;
    int32_t lo, hi, next;
  };
  struct BlockRuns {
    BlockRuns(int32_t b, int32_t f) : block(b), first(f) {}
    int32_t block;
    int32_t first;
  };
  // The blocks the step writes: step_blocks maps block -> k, and
  // block_runs[k] names the block and its first range in writes (a few cache
  // lines per step, not a mark per block of the pool; the next prepare()
  // erases exactly these names, whichever table it is for).
  NameIndex step_blocks;
  std::vector<BlockRuns> block_runs;
  std::vector<WriteRange> writes;
  std::vector<uint32_t> seen;  // per block: the epoch of the check that last saw it
  uint32_t epoch = 0;
};

SequenceTable::Scratch& SequenceTable::scratch() {
  thread_local Scratch s;
  return s;
}

std::string SequenceTable::bad_blocks(const std::vector<int32_t>& valid,
                                      const std::vector<int32_t>& added) const {
  if (added.empty()) return {};
  const int32_t num_blocks = options_.num_blocks;
  Scratch& sc = scratch();
  std::vector<uint32_t>& seen = sc.seen;
  if (seen.size() < static_cast<size_t>(num_blocks)) seen.resize(static_cast<size_t>(num_blocks), 0);
  if (++sc.epoch == 0) {  // wrapped: old marks could read as this check's
    std::fill(seen.begin(), seen.end(), 0);
    sc.epoch = 1;
  }
  const uint32_t epoch = sc.epoch;
  for (int32_t b : valid) seen[static_cast<size_t>(b)] = epoch;
  for (int32_t b : added) {
    if (b < 0 || b >= num_blocks) {
      return "block " + std::to_string(b) + " is outside the pool of " + std::to_string(num_blocks) +
             " blocks";
    }
    uint32_t& mark = seen[static_cast<size_t>(b)];
    if (mark == epoch) return "block table names block " + std::to_string(b) + " twice";
    mark = epoch;
  }
  return {};
}

SequenceTable::Entry* SequenceTable::find(uint64_t seq_id) {
  const int32_t i = index_.find(seq_id);
  return i < 0 ? nullptr : &entries_[static_cast<size_t>(i)];
}

const SequenceTable::Entry* SequenceTable::find(uint64_t seq_id) const {
  const int32_t i = index_.find(seq_id);
  return i < 0 ? nullptr : &entries_[static_cast<size_t>(i)];
}

void SequenceTable::forget(uint64_t seq_id) {
  const int32_t i = index_.find(seq_id);
  if (i < 0) return;
  index_.erase(seq_id);
  free_entries_.push_back(i);
}

SequenceTable::Entry& SequenceTable::learn(uint64_t seq_id) {
  int32_t i;
  if (free_entries_.empty()) {
    i = static_cast<int32_t>(entries_.size());
    entries_.emplace_back();
  } else {
    i = free_entries_.back();
    free_entries_.pop_back();
  }
  index_.insert(seq_id, i);
  Entry& en = entries_[static_cast<size_t>(i)];
  en.step_mark = 0;
  return en;
}

SequenceTable::SequenceTable(const SequenceTableOptions& o) : options_(o) {
  if (o.num_blocks < 1 || o.block_size < 1 || o.max_positions < 1 || o.vocab_size < 1) {
    throw std::invalid_argument(
        "SequenceTable: num_blocks, block_size, max_positions and vocab_size must be >= 1");
  }
}

std::string SequenceTable::check_new(const NewSequence& ns) const {
  const auto n = static_cast<int64_t>(ns.tokens.size());
  if (n == 0) return "new sequence has no tokens";
  if (n > options_.max_positions) {
    return "new sequence has " + std::to_string(n) + " tokens, beyond n_positions " +
           std::to_string(options_.max_positions);
  }
  for (int32_t t : ns.tokens) {
    if (t < 0 || t >= options_.vocab_size) {
      return "token " + std::to_string(t) + " is outside the vocabulary [0, " +
             std::to_string(options_.vocab_size) + ")";
    }
  }
  if (ns.num_generated < 0 || ns.num_generated >= n) {
    return "num_generated " + std::to_string(ns.num_generated) +
           " must leave a prompt of at least one of the " + std::to_string(n) + " tokens";
  }
  if (ns.num_cached < 0 || ns.num_cached >= n || ns.num_cached % options_.block_size != 0) {
    return "num_cached " + std::to_string(ns.num_cached) +
           " must be a whole number of blocks below the length " + std::to_string(n);
  }
  if (static_cast<int64_t>(ns.block_table.size()) < blocks_needed(ns.num_cached, options_.block_size)) {
    return "block table does not cover the cached tokens";
  }
  if (auto e = bad_blocks({}, ns.block_table); !e.empty()) return e;
  try {
    validate(ns.sampling, options_.vocab_size);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

template <typename Items>
void SequenceTable::prefetch_entries(const Items& items) {
  for (const auto& x : items) index_.prefetch(x.seq_id);
  prefetched_.clear();
  for (const auto& x : items) {
    const int32_t i = index_.find(x.seq_id);
    if (i < 0) continue;
    const char* en = reinterpret_cast<const char*>(&entries_[static_cast<size_t>(i)]);
    __builtin_prefetch(en, 1);
    __builtin_prefetch(en + sizeof(Entry) - 1, 1);
    prefetched_.push_back(i);
  }
}

void SequenceTable::prefetch_work(const std::vector<SeqWork>& work, const std::vector<SeqChunk>* reuse) {
  prefetch_entries(work);
  size_t k = 0;
  const size_t n_reuse = reuse != nullptr ? reuse->size() : 0;
  for (const int32_t i : prefetched_) {
    const Entry& en = entries_[static_cast<size_t>(i)];
    if (!en.blocks.empty()) {
      __builtin_prefetch(en.blocks.data());
      __builtin_prefetch(&en.blocks.back());
    }
    if (static_cast<size_t>(en.num_computed) < en.tokens.size())
      __builtin_prefetch(&en.tokens[en.num_computed]);
    if (k < n_reuse) {  // the reused chunk this item's work goes to, for writing
      const SeqChunk& c = (*reuse)[k++];
      __builtin_prefetch(&c, 1);
      if (c.block_table.capacity() > 0) __builtin_prefetch(c.block_table.data(), 1);
      if (c.token_ids.capacity() > 0) __builtin_prefetch(c.token_ids.data(), 1);
    }
  }
}

void SequenceTable::prefetch_chunks(const std::vector<SeqChunk>& chunks) {
  prefetch_entries(chunks);
  for (const int32_t i : prefetched_) {
    const Entry& en = entries_[static_cast<size_t>(i)];
    if (!en.tokens.empty()) __builtin_prefetch(en.tokens.data() + en.tokens.size(), 1);
  }
}

PreparedStep SequenceTable::prepare(const StepPlan& plan) {
  PreparedStep step;
  prepare(plan, step);
  return step;
}

template <typename BlockAt>
bool SequenceTable::writes_clash(uint64_t seq, int64_t start, int64_t end, const BlockAt& block_at) {
  const int64_t bs = options_.block_size;
  Scratch& sc = scratch();
  // An item writes one run of slots [lo, hi) in each block k it touches; a
  // clash is another sequence's run in the same block that overlaps it.
  auto lo = [&](int64_t k) { return static_cast<int32_t>(std::max(start, k * bs) - k * bs); };
  auto hi = [&](int64_t k) { return static_cast<int32_t>(std::min(end, (k + 1) * bs) - k * bs); };
  for (int64_t k = start / bs; k * bs < end; ++k) {
    const int32_t at = sc.step_blocks.find(static_cast<uint64_t>(block_at(k)));
    if (at < 0) continue;
    for (int32_t r = sc.block_runs[static_cast<size_t>(at)].first; r >= 0;
         r = sc.writes[static_cast<size_t>(r)].next) {
      const Scratch::WriteRange& w = sc.writes[static_cast<size_t>(r)];
      if (w.seq != seq && w.lo < hi(k) && lo(k) < w.hi) return true;
    }
  }
  for (int64_t k = start / bs; k * bs < end; ++k) {
    const int32_t block = block_at(k);
    int32_t at = sc.step_blocks.find(static_cast<uint64_t>(block));
    if (at < 0) {
      at = static_cast<int32_t>(sc.block_runs.size());
      sc.step_blocks.insert(static_cast<uint64_t>(block), at);
      sc.block_runs.emplace_back(block, -1);
    }
    int32_t& first = sc.block_runs[static_cast<size_t>(at)].first;
    sc.writes.emplace_back(seq, lo(k), hi(k), first);
    first = static_cast<int32_t>(sc.writes.size() - 1);
  }
  return false;
}

template <typename Accept>
void SequenceTable::resolve(const StepPlan& plan, std::vector<SeqFailure>& failures,
                            const std::vector<SeqChunk>* reuse, const Accept& accept) {
  failures.clear();
  if (++step_epoch_ == 0) {  // wrapped: old marks could read as this step's
    for (Entry& en : entries_) en.step_mark = 0;
    step_epoch_ = 1;
  }
  Scratch& sc = scratch();
  for (const Scratch::BlockRuns& b : sc.block_runs) sc.step_blocks.erase(static_cast<uint64_t>(b.block));
  sc.block_runs.clear();
  sc.writes.clear();
  gone_in_step_.clear();
  refused_new_.clear();
  for (uint64_t id : plan.drop) forget(id);
  for (const NewSequence& ns : plan.new_seqs) {
    forget(ns.seq_id);  // a new sequence replaces whatever had its id
    if (std::string e = check_new(ns); !e.empty()) {
      refused_new_.emplace_back(ns.seq_id, std::move(e));
      continue;
    }
    Entry& en = learn(ns.seq_id);
    // Room for every position at once: one allocation of one size per
    // sequence, not a chain of doubling ones as it grows token by token.
    en.tokens.reserve(static_cast<size_t>(options_.max_positions));
    en.tokens.assign(ns.tokens.begin(), ns.tokens.end());
    en.blocks = ns.block_table;
    en.num_computed = ns.num_cached;
    en.num_prompt = static_cast<int32_t>(ns.tokens.size()) - ns.num_generated;
    en.sampling = ns.sampling;
  }

  prefetch_work(plan.work, reuse);
  const int64_t bs = options_.block_size;
  for (const SeqWork& w : plan.work) {
    auto refuse = [&](const std::string& why, bool retryable) {
      failures.push_back({w.seq_id, "seq " + std::to_string(w.seq_id) + ": " + why, retryable});
      forget(w.seq_id);
      gone_in_step_.push_back(w.seq_id);
    };
    // A new sequence refused in this plan: its work is refused with the
    // reason (the last refusal of that id).
    const auto refused = std::find_if(refused_new_.rbegin(), refused_new_.rend(),
                                      [&](const auto& r) { return r.first == w.seq_id; });
    if (refused != refused_new_.rend()) {
      refuse(refused->second, false);
      continue;
    }
    Entry* found = find(w.seq_id);
    if ((found != nullptr && found->step_mark == step_epoch_) ||
        std::find(gone_in_step_.begin(), gone_in_step_.end(), w.seq_id) != gone_in_step_.end()) {
      failures.push_back({w.seq_id, "seq " + std::to_string(w.seq_id) + " appears twice in one step", true});
      continue;
    }
    if (found == nullptr) {
      refuse("the worker does not hold this sequence (never sent, dropped, or lost)", true);
      continue;
    }
    Entry& en = *found;
    en.step_mark = step_epoch_;
    if (w.start_pos != en.num_computed) {
      refuse("plan starts at position " + std::to_string(w.start_pos) + ", the worker has computed " +
                 std::to_string(en.num_computed),
             true);
      continue;
    }
    const int64_t end = static_cast<int64_t>(w.start_pos) + w.num_tokens;
    if (w.num_tokens < 1 || end > static_cast<int64_t>(en.tokens.size())) {
      refuse("plan runs " + std::to_string(w.num_tokens) + " tokens from " + std::to_string(w.start_pos) +
                 " but the worker knows " + std::to_string(en.tokens.size()),
             true);
      continue;
    }
    if (end > options_.max_positions) {
      refuse("positions reach " + std::to_string(end - 1) + ", beyond n_positions " +
                 std::to_string(options_.max_positions),
             false);
      continue;
    }
    if (w.sample && end != static_cast<int64_t>(en.tokens.size())) {
      refuse("plan samples after position " + std::to_string(end - 1) + " but the sequence is longer", true);
      continue;
    }
    // en.blocks was checked when it was learned or last grown: only the new
    // blocks can be outside the pool or repeat one.
    if (auto e = bad_blocks(en.blocks, w.new_blocks); !e.empty()) {
      refuse(e, true);
      continue;
    }
    const size_t held = en.blocks.size(), table_size = held + w.new_blocks.size();
    if (static_cast<int64_t>(table_size) < blocks_needed(end, bs)) {
      refuse("block table holds " + std::to_string(table_size) + " blocks, " + std::to_string(end) +
                 " tokens need " + std::to_string(blocks_needed(end, bs)),
             true);
      continue;
    }
    auto block_at = [&](int64_t i) {
      const auto k = static_cast<size_t>(i);
      return k < held ? en.blocks[k] : w.new_blocks[k - held];
    };
    if (writes_clash(w.seq_id, w.start_pos, end, block_at)) {
      refuse("writes a KV slot that another sequence writes in this step", true);
      continue;
    }
    en.blocks.insert(en.blocks.end(), w.new_blocks.begin(), w.new_blocks.end());
    accept(en, w, end);
  }
}

void SequenceTable::prepare(const StepPlan& plan, PreparedStep& step) {
  step.step_id = plan.step_id;
  size_t n_chunks = 0;  // step.chunks[0, n_chunks) hold this step's; the rest are reused buffers
  resolve(plan, step.failures, &step.chunks, [&](const Entry& en, const SeqWork& w, int64_t end) {
    if (n_chunks == step.chunks.size()) step.chunks.emplace_back();
    SeqChunk& c = step.chunks[n_chunks++];
    c.seq_id = w.seq_id;
    c.start_pos = w.start_pos;
    c.token_ids.assign(en.tokens.begin() + w.start_pos, en.tokens.begin() + end);
    c.block_table.assign(en.blocks.begin(), en.blocks.end());
    c.sample = w.sample;
    c.sampling = en.sampling;
    c.history.clear();
    c.history_prompt = 0;
    if (w.sample && (en.sampling.counts_generated() || en.sampling.repeats_prompt())) {
      const int32_t from = en.sampling.repeats_prompt() ? 0 : en.num_prompt;
      c.history.assign(en.tokens.begin() + from, en.tokens.end());
      c.history_prompt = en.num_prompt - from;
    }
    c.score_ids.clear();
    if (en.sampling.prompt_logprobs >= 0) {
      const auto from = en.tokens.begin() + w.start_pos + 1;
      c.score_ids.assign(from, from + prompt_rows_scored(w.start_pos, w.num_tokens, en.num_prompt));
    }
  });
  step.chunks.resize(n_chunks);
}

bool SequenceTable::advance(const StepPlan& plan, std::vector<SeqFailure>& failures,
                            const std::function<int32_t(uint64_t seq_id, int32_t position)>& token) {
  resolve(plan, failures, nullptr, [&](Entry& en, const SeqWork& w, int64_t end) {
    en.num_computed = static_cast<int32_t>(end);
    if (w.sample) en.tokens.push_back(token(w.seq_id, static_cast<int32_t>(end)));
  });
  return failures.empty();
}

void SequenceTable::commit(const PreparedStep& step, const std::vector<SeqOutput>& outputs,
                           const std::vector<uint64_t>& failed) {
  const std::unordered_set<uint64_t> bad(failed.begin(), failed.end());
  prefetch_chunks(step.chunks);
  size_t j = 0;
  for (const SeqChunk& c : step.chunks) {
    Entry* en_ptr = find(c.seq_id);
    if (en_ptr == nullptr) continue;
    if (!bad.empty() && bad.count(c.seq_id)) {
      forget(c.seq_id);
      continue;
    }
    Entry& en = *en_ptr;
    en.num_computed = c.start_pos + static_cast<int32_t>(c.token_ids.size());
    if (c.sample) {
      if (j >= outputs.size() || outputs[j].seq_id != c.seq_id) {
        throw std::logic_error("SequenceTable::commit: outputs do not follow the sampling chunks");
      }
      en.tokens.push_back(outputs[j++].token.id);
    }
  }
}

void SequenceTable::abort(const PreparedStep& step) {
  for (const SeqChunk& c : step.chunks) forget(c.seq_id);
}

std::vector<int32_t> SequenceTable::tokens(uint64_t seq_id) const {
  const Entry* en = find(seq_id);
  return en == nullptr ? std::vector<int32_t>{} : en->tokens;
}

int32_t SequenceTable::num_computed(uint64_t seq_id) const {
  const Entry* en = find(seq_id);
  return en == nullptr ? -1 : en->num_computed;
}

}  // namespace troupe::core
