#pragma once
// Scheduler: the pure core of the batcher for one worker. It owns the worker's
// KV block allocation and forms every step of that worker.
//
// Iteration-level scheduling (Orca, OSDI'22): sequences join and leave the
// batch between any two steps. Each step mixes one-token decodes with prompt
// chunks under a token budget (Sarathi-Serve's chunked prefill, OSDI'24).
// KV memory is paged (PagedAttention, SOSP'23): blocks are taken as a sequence
// grows, full blocks are shared between equal prefixes (vLLM V1's prefix
// caching), and when a sequence finds no block the running sequence with the
// largest (priority, arrival) is preempted by recompute (vLLM's victim under
// its priority policy; under plain FCFS, the newest).
//
// A sequence's life (each live request is in exactly one state):
//
//   submit ──▶ WAITING ──admit (next chunk's blocks fit above the watermark)──▶ RUNNING
//                 ▲                                                            │  │
//                 └──── preempt, or a failed step (retried once) ──────────────┘  │
//   cancel/stop/error (any state), eos/length, extract (moved) ───────▶ GONE ◀────┘
//
// Protocol: schedule() may be called while fewer than max_steps_in_flight
// steps are in flight; on_step_done() takes their results oldest first
// (asynchronous scheduling: with 2, step k+1 is planned while step k runs, and
// the worker feeds each sequence its own just-sampled token). submit(),
// cancel(), finish(), extract() and take_events() may be called at any time.
// No threads, clocks, I/O or randomness (seeds come from a counter), so the
// actor shell and the discrete-event simulator drive the very same code.
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/block_allocator.hpp"
#include "core/request.hpp"
#include "core/step_plan.hpp"

namespace troupe::core {

struct SchedulerOptions {
  int32_t num_blocks = 1024;              // KV blocks in the worker's pool; >= 1
  int32_t block_size = 16;                // token slots per block; >= 1
  int32_t max_num_batched_tokens = 2048;  // tokens per step (prefill chunks + decodes); >= 1
  int32_t max_num_seqs = 256;             // running sequences at most; >= 1
  int32_t max_model_len = 1024;           // prompt + generated tokens at most (the model's n_positions)
  int32_t vocab_size = 50257;             // token ids must lie in [0, vocab_size)
  bool enable_prefix_caching = true;      // share full KV blocks between equal prefixes
  bool enable_chunked_prefill = true;     // false: a prompt runs whole in one step (it must fit the budget)
  double watermark = 0.01;                // fraction of blocks admission leaves free; [0, 1)
  int32_t eos_id = 50256;                 // ends a request unless ignore_eos; -1 = no eos
  uint64_t seed = 0;                      // base of the seeds drawn for requests that bring none
  int32_t max_steps_in_flight = 1;        // 1: schedule and on_step_done alternate; 2: plan ahead; [1, 8]
  uint64_t hash_key = 0;                  // prefix-cache names' key; 0 = random (see BlockAllocator)
};

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t steps_in_flight = 0;
  int32_t blocks_used = 0;          // ref >= 1
  int32_t blocks_free = 0;          // ref 0, including cached ones that can be evicted
  int32_t blocks_cached = 0;        // holding a prefix name (used or evictable)
  int64_t tokens_held = 0;          // KV slots filled or being filled, over running sequences
  int64_t slots_allocated = 0;      // block_size * blocks, over running sequences
  double kv_utilization = 0.0;      // tokens_held / slots_allocated (0 when nothing is allocated)
  int64_t prefix_query_tokens = 0;  // tokens looked up at admission
  int64_t prefix_hit_tokens = 0;    // of which served from the cache
  int64_t prefix_hit_blocks = 0;
  int64_t prefix_miss_blocks = 0;  // full blocks looked up and not found
  int64_t evictions = 0;           // cached blocks reused for other contents
  int64_t preemptions = 0;
  int64_t failed_steps = 0;      // results with a whole-step error
  int64_t retries = 0;           // sequences sent back to waiting by a failure
  int64_t steps = 0;             // non-empty plans formed
  int64_t tokens_scheduled = 0;  // tokens in all plans formed
  int64_t tokens_generated = 0;  // tokens sampled and appended
};

struct Sequence;

class Scheduler {
 public:
  // Throws std::invalid_argument on impossible options.
  explicit Scheduler(const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Why `request` cannot be queued here, or nullopt. Changes nothing.
  std::optional<std::string> check(const Request& request) const;
  // Whether a request that check() accepted on a worker of the same model
  // (vocabulary and eos) also fits here: this worker's limits (max_model_len,
  // KV pool, step size without chunked prefill). Equivalent to
  // !check(request) then, without check()'s per-token scan, for an id no
  // worker uses: placement asks every worker, and the batcher refuses the id
  // of an unfinished request before it places anything (submit() still
  // checks ids).
  bool fits(const Request& request) const { return fits(options_, request); }
  // The same for a scheduler with these options (the batcher asks it without
  // touching every worker's scheduler).
  static bool fits(const SchedulerOptions& options, const Request& request);
  // Queues a request. Returns why it was refused (and changes nothing), or
  // nullopt when it is waiting.
  std::optional<std::string> submit(Request request);
  // Ends a request in any state at once (blocks freed, final event with
  // `reason`: kCancelled, kStop when its text matched a stop string, kError
  // with `error`). Tokens of it in steps still in flight are ignored when
  // their results come. False for an unknown id.
  bool finish(uint64_t id, FinishReason reason, const std::string& error = {});
  bool cancel(uint64_t id) { return finish(id, FinishReason::kCancelled); }
  // Takes an unfinished request out without a final event, as a Request that
  // continues it elsewhere: prompt_ids as submitted, output_ids every token
  // received so far, the same max_tokens, seed and priority. Tokens still in
  // flight are dropped (recomputed there). nullopt for an unknown id.
  std::optional<Request> extract(uint64_t id);
  // extract() of every unfinished request, in arrival order.
  std::vector<Request> extract_all();

  // Forms the next step: running decodes, then chunks of partly prefilled
  // prompts, then admissions in policy order. The plan's work is empty (and
  // no step goes in flight) when nothing can run now. Throws
  // std::logic_error when max_steps_in_flight steps are already in flight.
  StepPlan schedule();
  bool can_schedule() const {
    return static_cast<int32_t>(in_flight_steps_.size()) < options_.max_steps_in_flight;
  }
  // Takes the result of the oldest step in flight: appends sampled tokens,
  // finishes requests, registers completed blocks in the prefix cache. A
  // failed step (result.error) or work item (result.failures) sends its
  // sequences back to waiting the first time when retryable, else ends them
  // with finish reason kError; every other request goes on. Throws
  // std::invalid_argument (and changes nothing) when the result does not match
  // the plan (step id, outputs not one per sampling item in plan order, a
  // token outside the vocabulary).
  void on_step_done(const StepResult& result);
  // The worker and its KV cache are gone: steps in flight are dropped, every
  // running sequence goes back to waiting (recompute), the prefix cache is
  // cleared. Nothing is lost.
  void on_worker_lost();

  // Drains the events produced since the last call, in order.
  std::vector<RequestEvent> take_events();
  // The same into `out` (cleared first), which leaves its buffer here for
  // the next events: callers that keep one vector allocate nothing per step.
  void take_events(std::vector<RequestEvent>& out);

  int32_t steps_in_flight() const { return static_cast<int32_t>(in_flight_steps_.size()); }
  bool step_in_flight() const { return !in_flight_steps_.empty(); }
  // The id of the oldest step in flight (the one on_step_done takes next); 0 = none.
  uint64_t oldest_step_in_flight() const {
    return in_flight_steps_.empty() ? 0 : in_flight_steps_.front().step_id;
  }
  bool is_waiting(uint64_t id) const;
  bool is_running(uint64_t id) const;
  bool contains(uint64_t id) const { return seqs_.count(id) != 0; }
  bool has_unfinished() const { return !seqs_.empty(); }
  int32_t num_unfinished() const { return static_cast<int32_t>(seqs_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  // Full blocks of `tokens` this worker's prefix cache holds now (placement).
  int32_t cached_prefix_blocks(const std::vector<int32_t>& tokens) const;
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  const BlockAllocator& allocator() const { return allocator_; }
  BlockAllocator& allocator_for_testing() { return allocator_; }
  // Passed to the allocator (BlockAllocator::set_root_observer): the batcher's
  // index of the first blocks its workers cache.
  void set_root_observer(BlockAllocator::RootObserver fn) { allocator_.set_root_observer(std::move(fn)); }

  // Throws std::logic_error unless: every block is free or owned, each
  // block's ref count equals its owners, a block owned twice is a cached
  // (shared) one, each live request is in exactly one state, a running
  // sequence holds exactly the blocks its scheduled tokens need, and in-flight
  // bookkeeping matches the steps in flight.
  void check_invariants() const;

 private:
  using WaitKey = std::tuple<int32_t, uint64_t, uint64_t>;  // (priority, arrival, id)
  struct WorkRef {
    uint64_t seq_id;
    int32_t slot;  // the sequence's slot in slab_ when planned (it may hold another since)
    bool sample;
  };
  struct StepRecord {
    uint64_t step_id;
    std::vector<WorkRef> work;  // parallel to the plan's work
    bool scores = false;        // some work item owes prompt scores (the result is checked for them)
  };

  int32_t blocks_for(int64_t tokens) const;
  void ensure_hashes(Sequence& s, int32_t full_blocks) const;
  bool try_admit(Sequence& s, int32_t& budget, StepPlan& plan);
  // Allocates blocks for s's next `want` tokens: shrinks a prompt chunk to the
  // free blocks, or preempts victims while not even one token fits. Returns the
  // tokens granted, 0 when s itself was preempted.
  int32_t grow(Sequence& s, int32_t want, int32_t& budget, StepPlan& plan, bool& preempted);
  void add_work(Sequence& s, int32_t n, StepPlan& plan);
  void preempt(Sequence& s, int32_t& budget, StepPlan& plan);
  void to_waiting(Sequence& s);
  void free_blocks(Sequence& s);
  void forget_at_worker(Sequence& s);
  void register_full_blocks(Sequence& s);
  bool append_token(Sequence& s, const SampledToken& tok);
  // A result's prompt scores against its step (before anything changes):
  // throws std::invalid_argument when one is misplaced or a work item lacks
  // the scores it owes; fills `scores` by seq_id.
  void check_prompt_scores(const StepResult& result, const StepRecord& rec,
                           const std::unordered_map<uint64_t, const SeqFailure*>& failed,
                           std::unordered_map<uint64_t, const PromptScores*>& scores) const;
  void deliver_prompt_scores(Sequence& s, const PromptScores& p);
  void fail(Sequence& s, const std::string& error, bool retryable);
  void end(Sequence& s, FinishReason reason, const std::string& error);
  void remove_finished();
  void insert_running(Sequence& s);
  void erase_running(Sequence& s);
  WaitKey wait_key(const Sequence& s) const;

  SchedulerOptions options_;
  BlockAllocator allocator_;
  int32_t watermark_blocks_;

  // Every live request: owned by slab_ (a slot per live sequence, reused once
  // free), found by id in seqs_. A step's record names each sequence's slot
  // too, so its result reaches the sequence without a lookup by id.
  std::vector<std::unique_ptr<Sequence>> slab_;
  void prefetch_sequences(const std::vector<WorkRef>& work) const;
  void prefetch_registrations(const std::vector<WorkRef>& work);
  // Blocks of `s` that are full and computed when `computed` tokens are in
  // the KV cache (what register_full_blocks offers to the prefix cache).
  int32_t full_blocks(const Sequence& s, int32_t computed) const;
  std::vector<int32_t> free_slots_;
  std::unordered_map<uint64_t, Sequence*> seqs_;
  std::vector<Sequence*> running_;  // by (priority, arrival): the preemption victim is the last
  std::set<WaitKey> waiting_;       // policy order

  uint64_t next_step_id_ = 1;
  std::deque<StepRecord> in_flight_steps_;  // oldest first
  std::vector<Sequence*> planned_;          // parallel to the plan being formed; null = taken back
  std::vector<uint64_t> pending_drops_;     // sequences the worker must forget in the next plan
  std::vector<WorkRef> spare_record_work_;  // a finished step's record buffer, for the next one

  uint64_t next_arrival_ = 0;
  uint64_t seed_counter_ = 0;
  std::vector<RequestEvent> events_;
  std::vector<uint64_t> finished_;  // ids marked finished, removed by remove_finished()
  SchedulerStats counters_;
};

}  // namespace troupe::core
