#pragma once
// Scheduler: the pure core of the batcher for one worker. It owns the worker's
// KV block allocation and forms every step of that worker.
//
// Iteration-level scheduling (Orca, OSDI'22): sequences join and leave the
// batch between any two steps. Each step mixes one-token decodes with prompt
// chunks under a token budget (Sarathi-Serve's chunked prefill, OSDI'24).
// KV memory is paged (PagedAttention, SOSP'23): blocks are taken as a sequence
// grows, full blocks are shared between equal prefixes (vLLM V1's prefix
// caching), and when a decode finds no block the newest running sequence is
// preempted by recompute.
//
// A sequence's life (each live request is in exactly one state):
//
//   submit ──▶ WAITING ──admit (next chunk's blocks fit above the watermark)──▶ RUNNING
//                 ▲                                                            │  │
//                 └──────────── preempt (blocks freed, tokens kept) ───────────┘  │
//   cancel (any state), eos / stop / length ─────────────────────────▶ FINISHED ◀─┘
//
// Protocol: schedule() and on_step_done() alternate; at most one step is in
// flight. submit(), cancel() and take_events() may be called at any time.
// No threads, clocks, I/O or randomness (seeds come from a counter), so the
// actor shell and the discrete-event simulator drive the very same code.
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "actors/request.hpp"
#include "model/block_allocator.hpp"
#include "model/step_plan.hpp"

namespace troupe::model {
class Tokenizer;
}

namespace troupe::actors {

struct SchedulerOptions {
  int32_t num_blocks = 1024;             // KV blocks in the worker's pool; >= 1
  int32_t block_size = 16;               // token slots per block; >= 1
  int32_t max_num_batched_tokens = 2048; // tokens per step (prefill chunks + decodes); >= 1
  int32_t max_num_seqs = 256;            // running sequences at most; >= 1
  int32_t max_model_len = 1024;          // prompt + generated tokens at most (the model's n_positions)
  int32_t vocab_size = 50257;            // token ids must lie in [0, vocab_size)
  bool enable_prefix_caching = true;     // share full KV blocks between equal prefixes
  bool enable_chunked_prefill = true;    // false: a prompt runs whole in one step (it must fit the budget)
  double watermark = 0.01;               // fraction of blocks admission leaves free; [0, 1)
  int32_t eos_id = 50256;                // ends a request unless ignore_eos; -1 = no eos
  uint64_t seed = 0;                     // base of the seeds drawn for requests that bring none
};

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t blocks_used = 0;       // ref >= 1
  int32_t blocks_free = 0;       // ref 0, including cached ones that can be evicted
  int32_t blocks_cached = 0;     // holding a prefix hash (used or evictable)
  int64_t tokens_held = 0;       // KV slots filled or being filled, over running sequences
  int64_t slots_allocated = 0;   // block_size * blocks, over running sequences
  double kv_utilization = 0.0;   // tokens_held / slots_allocated (0 when nothing is allocated)
  int64_t prefix_query_tokens = 0;  // tokens looked up at admission
  int64_t prefix_hit_tokens = 0;    // of which served from the cache
  int64_t prefix_hit_blocks = 0;
  int64_t prefix_miss_blocks = 0;   // full blocks looked up and not found
  int64_t evictions = 0;            // cached blocks reused for other contents
  int64_t preemptions = 0;
  int64_t steps = 0;                // non-empty plans formed
  int64_t tokens_scheduled = 0;     // tokens in all plans formed
  int64_t tokens_generated = 0;     // tokens sampled and appended
};

struct Sequence;

class Scheduler {
 public:
  // `tokenizer` (may be nullptr, must outlive the scheduler) turns tokens into
  // streamed text and enables stop strings. Throws std::invalid_argument on
  // impossible options.
  explicit Scheduler(const SchedulerOptions& options, const model::Tokenizer* tokenizer = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Returns why it was refused (and changes nothing), or
  // nullopt when it is waiting.
  std::optional<std::string> submit(Request request);
  // Ends a request in any state at once (blocks freed, final event
  // "cancelled"); false for an unknown or finished id. Its tokens in a step
  // still in flight are ignored when the result comes.
  bool cancel(uint64_t id);

  // Forms the next step: running decodes, then chunks of partly prefilled
  // prompts, then admissions in policy order. The plan is empty (and no step
  // goes in flight) only when no request is unfinished. Throws
  // std::logic_error while a step is in flight.
  model::StepPlan schedule();
  // Takes the in-flight step's result: appends sampled tokens, finishes
  // requests, registers completed blocks in the prefix cache. Throws
  // std::invalid_argument (and changes nothing) when the result does not
  // match the plan (step id, or one output per sampling chunk in plan order).
  void on_step_done(const model::StepResult& result);
  // The worker and its KV cache are gone: the in-flight step is dropped,
  // every running sequence goes back to waiting (recompute), the prefix cache
  // is cleared. Nothing is lost.
  void on_worker_lost();

  // Drains the events produced since the last call, in order.
  std::vector<RequestEvent> take_events();

  bool step_in_flight() const { return in_flight_; }
  bool is_waiting(uint64_t id) const;
  bool is_running(uint64_t id) const;
  bool has_unfinished() const { return !seqs_.empty(); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  const model::BlockAllocator& allocator() const { return allocator_; }

  // Throws std::logic_error unless: every block is free or owned, each
  // block's ref count equals its owners, a block owned twice is a cached
  // (shared) one, each live request is in exactly one state, and a running
  // sequence holds exactly the blocks its tokens need (at most block_size - 1
  // slots allocated but unused).
  void check_invariants() const;

 private:
  using WaitKey = std::tuple<int32_t, uint64_t, uint64_t>;  // (priority, arrival, id)

  std::optional<std::string> check_request(const Request& r) const;
  int32_t blocks_for(int64_t tokens) const;
  void ensure_hashes(Sequence& s, int32_t full_blocks) const;
  bool try_admit(Sequence& s, int32_t& budget, model::StepPlan& plan);
  // Allocates blocks for s's next `want` tokens: shrinks a prompt chunk to the
  // free blocks, or preempts the newest running sequences while not even one
  // token fits. Returns the tokens granted, 0 when s itself was preempted.
  int32_t grow(Sequence& s, int32_t want, int32_t& budget, model::StepPlan& plan, bool& preempted);
  void add_chunk(Sequence& s, int32_t n, model::StepPlan& plan);
  void preempt(Sequence& s, int32_t& budget, model::StepPlan& plan);
  void free_blocks(Sequence& s);
  void register_full_blocks(Sequence& s);
  bool append_token(Sequence& s, const model::SampledToken& tok);
  void finish(Sequence& s, FinishReason reason);
  WaitKey wait_key(const Sequence& s) const;

  SchedulerOptions options_;
  const model::Tokenizer* tokenizer_;
  model::BlockAllocator allocator_;
  int32_t watermark_blocks_;

  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;  // every live request
  std::vector<Sequence*> running_;                                // in admission order (newest last)
  std::set<WaitKey> waiting_;                                     // policy order

  bool in_flight_ = false;
  uint64_t next_step_id_ = 1;
  uint64_t in_flight_step_ = 0;
  std::vector<std::pair<uint64_t, bool>> in_flight_seqs_;  // (seq_id, sample) per chunk of the in-flight plan
  int32_t in_flight_samples_ = 0;

  std::vector<Sequence*> planned_;  // parallel to the plan being formed; null = chunk taken back

  uint64_t next_arrival_ = 0;
  uint64_t seed_counter_ = 0;
  std::vector<RequestEvent> events_;
  SchedulerStats counters_;
};

}  // namespace troupe::actors
