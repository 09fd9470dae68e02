#pragma once
// SequenceTable: a worker's per-sequence state, and the checking of step plans
// against it. Every worker keeps one (the real one in front of the model, the
// emulated one in front of a cost model, the tests' fake one): it knows each
// live sequence's tokens (those it was sent, then those it sampled itself),
// its block table and how many tokens are in the KV cache, so a plan only
// names what changed (core/step_plan.hpp).
//
// A step on the worker:
//
//   PreparedStep p = table.prepare(plan);   // drop, learn, resolve work into chunks
//   ... run p.chunks through the model ...  // or fail: table.abort(p)
//   table.commit(p, outputs, failed);       // advance, append sampled tokens
//
// A work item the table refuses (unknown sequence, positions that disagree,
// blocks outside the pool, a KV slot another item writes) becomes a
// SeqFailure and its sequence is forgotten; the rest of the step runs.
// Torch-free, no threads.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/name_index.hpp"
#include "core/step_plan.hpp"

namespace troupe::core {

struct SequenceTableOptions {
  int32_t num_blocks = 1;     // KV blocks in the worker's pool; >= 1
  int32_t block_size = 16;    // token slots per block; >= 1
  int32_t max_positions = 1;  // the model's n_positions: positions must stay below it
  int32_t vocab_size = 1;     // token ids must lie in [0, vocab_size)
};

struct PreparedStep {
  uint64_t step_id = 0;
  std::vector<SeqChunk> chunks;      // the work that runs, in plan order
  std::vector<SeqFailure> failures;  // work items refused, in plan order
};

class SequenceTable {
 public:
  explicit SequenceTable(const SequenceTableOptions& options);

  // Forgets plan.drop, learns plan.new_seqs, and turns each work item into a
  // chunk with its tokens and whole block table. New blocks are appended
  // here; positions advance only in commit().
  PreparedStep prepare(const StepPlan& plan);
  // The same into `out`, reusing its buffers (a caller that keeps one
  // PreparedStep allocates nothing per step once they have grown).
  void prepare(const StepPlan& plan, PreparedStep& out);
  // The step ran. outputs: one per sampling chunk that sampled, in chunk
  // order; `failed`: chunks whose sampling failed (their sequences are
  // forgotten). Every other chunk's sequence advances by its tokens, and a
  // sampled token is appended to its sequence.
  void commit(const PreparedStep& step, const std::vector<SeqOutput>& outputs,
              const std::vector<uint64_t>& failed);
  // The step failed as a whole: forgets every sequence it ran.
  void abort(const PreparedStep& step);
  // For a worker that runs no model (the simulator's emulated one): checks
  // `plan` as prepare() does and advances each accepted item as commit()
  // does after the step, in one pass and without building chunks; a sampling
  // item appends token(seq_id, position after its last token). Leaves the
  // table as prepare() then commit() would (each refused item's sequence
  // forgotten, `failures` as prepare's; each accepted one advanced): no
  // item's checks read another sequence's state. True when none was refused.
  bool advance(const StepPlan& plan, std::vector<SeqFailure>& failures,
               const std::function<int32_t(uint64_t seq_id, int32_t position)>& token);

  bool contains(uint64_t seq_id) const { return find(seq_id) != nullptr; }
  size_t size() const { return index_.size(); }
  // Tokens the worker knows for a sequence (tests); empty when unknown.
  std::vector<int32_t> tokens(uint64_t seq_id) const;
  int32_t num_computed(uint64_t seq_id) const;
  const SequenceTableOptions& options() const { return options_; }

 private:
  struct Entry {
    uint32_t step_mark = 0;  // step_epoch_ of the last prepare() whose work named it
    int32_t num_computed = 0;
    int32_t num_prompt = 0;  // tokens[num_prompt, end) were generated
    std::vector<int32_t> tokens;
    std::vector<int32_t> blocks;
    SamplingParams sampling;
  };
  // A worker's next plan names sequences whose state went cold since its last
  // step (a forward pass ran in between; the simulator ran other workers):
  // these ask for all of it at once, in rounds (index slots, entries, then
  // what each entry points to), instead of one miss after another per item.
  // `reuse`: the chunks the items' work goes to, prefetched for writing
  // (none for advance()).
  void prefetch_work(const std::vector<SeqWork>& work, const std::vector<SeqChunk>* reuse);
  // prepare() and advance(): forgets plan.drop, learns plan.new_seqs, checks
  // each work item (a refusal goes to `failures`, its sequence forgotten) and
  // calls accept(entry, item, end) for each accepted one, its new blocks
  // appended to the entry by then. `reuse` as for prefetch_work.
  template <typename Accept>
  void resolve(const StepPlan& plan, std::vector<SeqFailure>& failures, const std::vector<SeqChunk>* reuse,
               const Accept& accept);
  // The first two rounds for any items naming sequences (`seq_id`): index
  // slots, then entries (both ends, for writing); the entries found go to
  // prefetched_.
  template <typename Items>
  void prefetch_entries(const Items& items);
  void prefetch_chunks(const std::vector<SeqChunk>& chunks);
  std::vector<int32_t> prefetched_;  // entries found by the last prefetch round
  // What one prepare() works in: the blocks its accepted items write, with
  // their runs of slots, and bad_blocks' per-block marks (defined in the
  // .cpp). One per thread, shared by every table on it: a process with many
  // tables (the simulator: one per worker) finds it in cache, where a table's
  // own would have gone cold by its next step.
  struct Scratch;
  static Scratch& scratch();
  // Whether the item of `seq` writing positions [start, end) through
  // `block_at` touches a slot another item of this step writes; records its
  // writes when it does not.
  template <typename BlockAt>
  bool writes_clash(uint64_t seq, int64_t start, int64_t end, const BlockAt& block_at);
  // Why a new sequence is unacceptable, or empty.
  std::string check_new(const NewSequence& ns) const;
  // Why appending `added` to the block table `valid` (already checked)
  // breaks it: a block outside the pool or named twice; empty when it is
  // fine. Marks blocks in the scratch (no allocation per check).
  std::string bad_blocks(const std::vector<int32_t>& valid, const std::vector<int32_t>& added) const;

  SequenceTableOptions options_;
  // Live sequences: entries_[index_.find(id)]; a forgotten sequence's entry
  // is reused (its token buffer too) by the next one learned.
  Entry* find(uint64_t seq_id);
  const Entry* find(uint64_t seq_id) const;
  void forget(uint64_t seq_id);
  Entry& learn(uint64_t seq_id);  // a fresh entry (seq_id not live)
  NameIndex index_;
  std::vector<Entry> entries_;
  std::vector<int32_t> free_entries_;
  // Per prepare(): its epoch (marks entries), the ids of items refused or
  // unknown (for "appears twice" once their entry is gone), the new
  // sequences refused and why.
  uint32_t step_epoch_ = 0;
  std::vector<uint64_t> gone_in_step_;
  std::vector<std::pair<uint64_t, std::string>> refused_new_;
};

}  // namespace troupe::core
