#include "core/scheduler.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/sequence.hpp"
#include "core/splitmix.hpp"

namespace troupe::core {
namespace {

const SchedulerOptions& checked(const SchedulerOptions& o) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("SchedulerOptions: " + what); };
  if (o.num_blocks < 1) bad("num_blocks must be >= 1");
  if (o.block_size < 1) bad("block_size must be >= 1");
  if (o.max_num_batched_tokens < 1) bad("max_num_batched_tokens must be >= 1");
  if (o.max_num_seqs < 1) bad("max_num_seqs must be >= 1");
  if (o.max_model_len < 1) bad("max_model_len must be >= 1 (the model's n_positions)");
  if (o.vocab_size < 1) bad("vocab_size must be >= 1");
  if (!(o.watermark >= 0.0 && o.watermark < 1.0)) bad("watermark must be in [0, 1)");
  if (o.eos_id < -1 || o.eos_id >= o.vocab_size) bad("eos_id must be -1 or in [0, vocab_size)");
  if (o.max_steps_in_flight < 1 || o.max_steps_in_flight > 8) bad("max_steps_in_flight must be in [1, 8]");
  return o;
}

void broken(const std::string& what) { throw std::logic_error("Scheduler invariant: " + what); }

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options)
    : options_(checked(options)),
      allocator_(options.num_blocks, options.block_size, options.enable_prefix_caching, options.hash_key),
      watermark_blocks_(static_cast<int32_t>(options.watermark * options.num_blocks)) {}

Scheduler::~Scheduler() = default;

int32_t Scheduler::blocks_for(int64_t tokens) const {
  return static_cast<int32_t>((tokens + options_.block_size - 1) / options_.block_size);
}

Scheduler::WaitKey Scheduler::wait_key(const Sequence& s) const {
  return {s.request.priority, s.arrival, s.id};
}

std::optional<std::string> Scheduler::check(const Request& r) const {
  const auto n = static_cast<int64_t>(r.prompt_ids.size());
  const auto done = static_cast<int64_t>(r.output_ids.size());
  auto id = [&] { return "request " + std::to_string(r.id) + ": "; };  // built only for an error
  if (seqs_.count(r.id) != 0) return id() + "id is already in use by an unfinished request";
  if (n == 0) return id() + "prompt is empty";
  if (n > options_.max_model_len) {
    return id() + "prompt has " + std::to_string(n) + " tokens, more than max_model_len " +
           std::to_string(options_.max_model_len);
  }
  const bool score_only = r.max_tokens == 0 && r.sampling.prompt_logprobs >= 0;
  if (r.max_tokens < 1 && !score_only)
    return id() + "max_tokens must be >= 1 (0 only with prompt_logprobs: scoring the prompt)";
  if (r.prompt_scored < 0 || r.prompt_scored > std::max<int64_t>(0, n - 1))
    return id() + "prompt_scored " + std::to_string(r.prompt_scored) + " is outside [0, prompt length - 1]";
  if (n + r.max_tokens > options_.max_model_len) {
    return id() + "prompt (" + std::to_string(n) + ") + max_tokens (" + std::to_string(r.max_tokens) +
           ") exceeds max_model_len " + std::to_string(options_.max_model_len) + "; lower max_tokens";
  }
  if (done >= r.max_tokens && !(score_only && done == 0))
    return id() + "already generated max_tokens tokens: nothing left to do";
  auto bad_id = [&](const std::vector<int32_t>& ids, const char* what) -> std::optional<std::string> {
    // One branch-free pass first (every prompt is checked at submission; it
    // vectorises), the search for the bad one only when there is one.
    uint32_t most = 0;  // as unsigned: a negative id is past any vocabulary
    for (int32_t t : ids) most = std::max(most, static_cast<uint32_t>(t));
    if (most < static_cast<uint32_t>(options_.vocab_size)) return std::nullopt;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= options_.vocab_size) {
        return id() + what + " token " + std::to_string(i) + " is id " + std::to_string(ids[i]) +
               ", outside the vocabulary [0, " + std::to_string(options_.vocab_size) + ")";
      }
    }
    return std::nullopt;
  };
  if (auto e = bad_id(r.prompt_ids, "prompt")) return e;
  if (auto e = bad_id(r.output_ids, "output")) return e;
  if (done > 0 && !r.ignore_eos && r.output_ids.back() == options_.eos_id) {
    return id() + "its output already ends with eos: nothing left to do";
  }
  try {
    validate(r.sampling, options_.vocab_size);
  } catch (const std::invalid_argument& e) {
    return id() + e.what();
  }
  // The last generated token is sampled, never fed back, so it takes no slot
  // (with none generated, every prompt token still takes one).
  const int64_t max_slots = n + std::max(r.max_tokens, 1) - 1;
  if (blocks_for(max_slots) > options_.num_blocks) {
    return id() + "needs up to " + std::to_string(blocks_for(max_slots)) + " KV blocks but the pool has " +
           std::to_string(options_.num_blocks) + "; shorten the prompt or lower max_tokens";
  }
  if (!options_.enable_chunked_prefill && max_slots > options_.max_num_batched_tokens) {
    return id() + "without chunked prefill up to " + std::to_string(max_slots) +
           " tokens may have to run in one step, more than max_num_batched_tokens " +
           std::to_string(options_.max_num_batched_tokens);
  }
  return std::nullopt;
}

bool Scheduler::fits(const SchedulerOptions& o, const Request& r) {
  const auto n = static_cast<int64_t>(r.prompt_ids.size());
  const int64_t max_slots = n + std::max(r.max_tokens, 1) - 1;
  const int64_t blocks = (max_slots + o.block_size - 1) / o.block_size;
  return n + r.max_tokens <= o.max_model_len && blocks <= o.num_blocks &&
         (o.enable_chunked_prefill || max_slots <= o.max_num_batched_tokens);
}

std::optional<std::string> Scheduler::submit(Request request) {
  if (auto error = check(request)) return error;
  auto s = std::make_unique<Sequence>();
  s->num_prompt = static_cast<int32_t>(request.prompt_ids.size());
  s->tokens = std::move(request.prompt_ids);
  s->tokens.reserve(static_cast<size_t>(s->num_prompt) + static_cast<size_t>(request.max_tokens));
  s->tokens.insert(s->tokens.end(), request.output_ids.begin(), request.output_ids.end());
  s->request = std::move(request);
  s->request.prompt_ids.clear();
  s->request.output_ids.clear();
  s->request.sampling.seed =
      s->request.seed ? *s->request.seed : splitmix64(options_.seed ^ splitmix64(seed_counter_++));
  s->request.seed = s->request.sampling.seed;
  s->id = s->request.id;
  s->max_tokens = s->request.max_tokens;
  s->prompt_scored = s->request.prompt_scored;
  s->ignore_eos = s->request.ignore_eos;
  s->wants_prompt_scores = s->request.sampling.prompt_logprobs >= 0;
  s->arrival = next_arrival_++;
  waiting_.insert(wait_key(*s));
  if (free_slots_.empty()) {
    s->slot = static_cast<int32_t>(slab_.size());
    slab_.emplace_back();
  } else {
    s->slot = free_slots_.back();
    free_slots_.pop_back();
  }
  seqs_.emplace(s->id, s.get());
  slab_[static_cast<size_t>(s->slot)] = std::move(s);
  return std::nullopt;
}

void Scheduler::ensure_hashes(Sequence& s, int32_t full_blocks) const {
  const int32_t bs = options_.block_size;
  // Room for every full block the sequence can reach, once (not a doubling
  // chain of copies as it grows: one per request, every request).
  if (s.hashes.capacity() == 0) s.hashes.reserve(s.tokens.capacity() / static_cast<size_t>(bs));
  for (auto i = static_cast<int32_t>(s.hashes.size()); i < full_blocks; ++i) {
    const uint64_t parent = i > 0 ? s.hashes[static_cast<size_t>(i) - 1] : 0;
    s.hashes.push_back(allocator_.hash_block(parent, s.tokens.data() + static_cast<ptrdiff_t>(i) * bs));
  }
}

int32_t Scheduler::cached_prefix_blocks(const std::vector<int32_t>& tokens) const {
  if (tokens.empty()) return 0;
  const auto full = static_cast<int32_t>((tokens.size() - 1) / static_cast<size_t>(options_.block_size));
  return allocator_.cached_prefix_length(tokens.data(), full);
}

void Scheduler::insert_running(Sequence& s) {
  const WaitKey key = wait_key(s);
  auto pos = std::upper_bound(running_.begin(), running_.end(), key,
                              [this](const WaitKey& k, const Sequence* r) { return k < wait_key(*r); });
  running_.insert(pos, &s);
}

void Scheduler::erase_running(Sequence& s) {
  auto it = std::find(running_.begin(), running_.end(), &s);
  if (it != running_.end()) running_.erase(it);
}

void Scheduler::add_work(Sequence& s, int32_t n, StepPlan& plan) {
  s.plan_index = static_cast<int32_t>(plan.work.size());
  SeqWork& w = plan.work.emplace_back();  // built in place: one per running sequence per step
  w.seq_id = s.id;
  w.start_pos = s.num_scheduled();
  w.num_tokens = n;
  if (static_cast<size_t>(s.blocks_sent) < s.blocks.size())
    w.new_blocks.assign(s.blocks.begin() + s.blocks_sent, s.blocks.end());
  w.sample = s.num_scheduled() + n == s.length() && s.max_tokens > 0;  // 0: scoring only
  w.score_rows = s.score_rows(s.num_scheduled(), n);
  s.blocks_sent = static_cast<int32_t>(s.blocks.size());
  s.in_flight.push_back({plan.step_id, n, w.sample});
  planned_.push_back(&s);
}

void Scheduler::free_blocks(Sequence& s) {
  allocator_.release_all(s.blocks);
  s.blocks.clear();
  s.blocks_sent = 0;
  s.num_computed = 0;
  s.num_registered = 0;
  s.in_flight.clear();
}

void Scheduler::forget_at_worker(Sequence& s) {
  if (s.known_to_worker) pending_drops_.push_back(s.id);
  s.known_to_worker = false;
}

void Scheduler::to_waiting(Sequence& s) {
  free_blocks(s);
  erase_running(s);
  s.state = Sequence::State::kWaiting;
  waiting_.insert(wait_key(s));
}

void Scheduler::preempt(Sequence& s, int32_t& budget, StepPlan& plan) {
  if (running_.empty() || running_.back() != &s) broken("preemption victim is not the last running sequence");
  if (s.plan_index >= 0) {  // already planned in this step: take its work back
    SeqWork& w = plan.work[static_cast<size_t>(s.plan_index)];
    budget += w.num_tokens;
    w.num_tokens = 0;
    planned_[static_cast<size_t>(s.plan_index)] = nullptr;
    s.plan_index = -1;
  }
  forget_at_worker(s);
  to_waiting(s);
  ++counters_.preemptions;
}

int32_t Scheduler::grow(Sequence& s, int32_t want, int32_t& budget, StepPlan& plan, bool& preempted) {
  const int32_t bs = options_.block_size;
  int32_t n = want;
  for (;;) {
    const auto held = static_cast<int32_t>(s.blocks.size());
    const int32_t need = blocks_for(static_cast<int64_t>(s.num_scheduled()) + n) - held;
    const int32_t free = allocator_.num_free();
    if (need <= free) break;
    // Short of blocks: a prompt chunk shrinks to what fits; a chunk that
    // cannot take one more token preempts the last running sequence (the
    // largest (priority, arrival): the least important, newest).
    const int64_t fit = static_cast<int64_t>(held + free) * bs - s.num_scheduled();
    if (fit >= 1 && options_.enable_chunked_prefill) {
      n = static_cast<int32_t>(fit);
      break;
    }
    Sequence& victim = *running_.back();
    preempted = true;
    preempt(victim, budget, plan);
    if (&victim == &s) return 0;
    n = std::min(s.num_pending(), std::min(want, budget));
  }
  const int32_t need =
      blocks_for(static_cast<int64_t>(s.num_scheduled()) + n) - static_cast<int32_t>(s.blocks.size());
  if (!allocator_.allocate(need, s.blocks)) broken("allocation failed after a successful check");
  return n;
}

bool Scheduler::try_admit(Sequence& s, int32_t& budget, StepPlan& plan) {
  const int32_t bs = options_.block_size;
  const auto total = static_cast<int32_t>(s.tokens.size());
  // At least the last token is computed: its logits give the next token. A
  // sequence that still owes prompt logprobs takes no hit: every prompt row
  // must run for its logits (its full blocks are still offered to others).
  const int32_t max_hit = s.scoring() ? 0 : (total - 1) / bs;
  std::vector<int32_t> hits;
  if (allocator_.prefix_caching()) {
    ensure_hashes(s, max_hit);
    hits = allocator_.find_prefix(s.hashes, s.tokens.data(), max_hit);
  }
  const auto num_hits = static_cast<int32_t>(hits.size());
  const int32_t cached = num_hits * bs;
  int32_t revived = 0;  // hits that sit in the LRU: sharing them takes them off the free count
  for (int32_t b : hits) revived += allocator_.ref_count(b) == 0 ? 1 : 0;
  // The watermark protects running sequences from preemption right after an
  // admission; with none running it would only keep the pool idle.
  const int32_t keep = running_.empty() ? 0 : watermark_blocks_;
  const int64_t avail = static_cast<int64_t>(allocator_.num_free()) - revived - keep;
  const int32_t pending = total - cached;
  int32_t n;
  if (options_.enable_chunked_prefill) {
    n = static_cast<int32_t>(std::min<int64_t>(std::min(pending, budget), avail * bs));
    if (n < 1) return false;
  } else {
    n = pending;
    if (n > budget || blocks_for(total) - num_hits > avail) return false;
  }

  waiting_.erase(wait_key(s));
  for (int32_t b : hits) allocator_.share(b);
  s.blocks = std::move(hits);
  // Room for the blocks of the whole sequence (its tokens' capacity: the
  // prompt and max_tokens), so that growing it token by token reallocates nothing.
  s.blocks.reserve(static_cast<size_t>(blocks_for(static_cast<int64_t>(s.tokens.capacity()))));
  if (!allocator_.allocate(blocks_for(static_cast<int64_t>(cached) + n) - num_hits, s.blocks)) {
    broken("admission allocation failed after a successful check");
  }
  if (allocator_.prefix_caching()) allocator_.record_lookup(max_hit, num_hits);
  counters_.prefix_query_tokens += total;
  counters_.prefix_hit_tokens += cached;
  s.num_computed = cached;
  s.num_registered = num_hits;
  if (!s.admitted_once) {
    s.admitted_once = true;
    s.cached_tokens = std::min(cached, s.num_prompt);  // a resumed request's history counts as prompt
    RequestEvent ev;
    ev.request_id = s.id;
    ev.kind = EventKind::kScheduled;
    ev.usage.prompt_tokens = s.num_prompt;
    ev.usage.cached_tokens = s.cached_tokens;
    events_.push_back(std::move(ev));
  }
  s.state = Sequence::State::kRunning;
  insert_running(s);

  NewSequence ns;
  ns.seq_id = s.id;
  ns.tokens = s.tokens;
  ns.num_generated = static_cast<int32_t>(s.tokens.size()) - s.num_prompt;
  ns.num_cached = cached;
  ns.block_table = s.blocks;
  ns.sampling = s.request.sampling;
  plan.new_seqs.push_back(std::move(ns));
  s.known_to_worker = true;
  s.blocks_sent = static_cast<int32_t>(s.blocks.size());
  add_work(s, n, plan);
  budget -= n;
  return true;
}

StepPlan Scheduler::schedule() {
  if (!can_schedule()) {
    throw std::logic_error(
        "Scheduler::schedule: " + std::to_string(in_flight_steps_.size()) +
        " steps are in flight, the most allowed; call on_step_done (or on_worker_lost) first");
  }
  StepPlan plan;
  plan.step_id = next_step_id_;
  plan.work.reserve(running_.size() + 4);  // every running sequence and a few admissions, without regrowth
  planned_.clear();
  int32_t budget = options_.max_num_batched_tokens;
  bool preempted = false;
  // A sampling chunk needs room for one more generated token.
  auto may_sample = [](const Sequence& s) { return s.num_generated() < s.max_tokens; };

  // 1. Running decodes, most important first: one token each (possibly the
  //    token a step in flight is sampling: the worker feeds its own).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    if (s.num_pending() != 1 || !may_sample(s) || s.max_tokens == 0) continue;
    if (grow(s, 1, budget, plan, preempted) == 0) continue;  // s itself was the victim (and the last)
    add_work(s, 1, plan);
    budget -= 1;
  }
  // 2. Next chunks of partly prefilled prompts (Sarathi-Serve).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    // A scoring-only sequence (max_tokens 0) has no decode: its last prompt
    // token runs here too, alone if need be.
    const bool score_only = s.max_tokens == 0;
    if (s.plan_index >= 0 || s.num_pending() < (score_only ? 1 : 2)) continue;
    const int32_t want = std::min(s.num_pending(), budget);
    if (s.num_scheduled() + want == s.length() && !may_sample(s) && !score_only) continue;
    const int32_t n = grow(s, want, budget, plan, preempted);
    if (n == 0) continue;
    add_work(s, n, plan);
    budget -= n;
  }
  // 3. Admissions in policy order; none past a request that does not fit (no
  //    overtaking), and none in a step that had to preempt unless it would
  //    otherwise run nothing.
  const bool any_work = std::any_of(planned_.begin(), planned_.end(), [](const Sequence* s) { return s; });
  while ((!preempted || !any_work) && !waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < options_.max_num_seqs) {
    Sequence& s = *seqs_.at(std::get<2>(*waiting_.begin()));
    if (!try_admit(s, budget, plan)) break;
  }

  // Drop work taken back by preemption; record what goes in flight.
  StepRecord record{plan.step_id, std::move(spare_record_work_)};
  record.work.clear();
  record.work.reserve(plan.work.size());
  size_t k = 0;
  for (size_t i = 0; i < plan.work.size(); ++i) {
    Sequence* s = planned_[i];
    if (s == nullptr) continue;
    s->plan_index = -1;
    WorkRef& ref = record.work.emplace_back();  // in place (a braced copy stalls on store forwarding)
    ref.seq_id = s->id;
    ref.slot = s->slot;
    ref.sample = plan.work[i].sample;
    record.scores = record.scores || plan.work[i].score_rows > 0;
    if (k != i) plan.work[k] = std::move(plan.work[i]);
    ++k;
  }
  plan.work.resize(k);
  planned_.clear();
  if (plan.work.empty()) {
    // Nothing runs (every sequence waits for a result or for blocks): no
    // step. New sequences are only made by admissions, which always add work.
    spare_record_work_ = std::move(record.work);
    return StepPlan{plan.step_id, {}, {}, {}};
  }
  plan.drop = std::move(pending_drops_);
  pending_drops_.clear();
  in_flight_steps_.push_back(std::move(record));
  ++next_step_id_;
  ++counters_.steps;
  counters_.tokens_scheduled += plan.num_tokens();
  return plan;
}

int32_t Scheduler::full_blocks(const Sequence& s, int32_t computed) const {
  return std::min(computed, static_cast<int32_t>(s.tokens.size())) / options_.block_size;
}

void Scheduler::register_full_blocks(Sequence& s) {
  if (!allocator_.prefix_caching()) return;
  const int32_t bs = options_.block_size;
  const int32_t full = full_blocks(s, s.num_computed);
  if (full <= s.num_registered) return;
  ensure_hashes(s, full);
  for (int32_t i = s.num_registered; i < full; ++i) {
    const int32_t parent = i > 0 ? s.blocks[static_cast<size_t>(i) - 1] : -1;
    allocator_.register_block(s.blocks[static_cast<size_t>(i)], parent, s.hashes[static_cast<size_t>(i)],
                              s.tokens.data() + static_cast<ptrdiff_t>(i) * bs);
  }
  s.num_registered = full;
}

void Scheduler::end(Sequence& s, FinishReason reason, const std::string& error) {
  RequestEvent ev;
  ev.request_id = s.id;
  ev.kind = EventKind::kFinished;
  ev.finish_reason = reason;
  ev.error = error;
  ev.output_ids.assign(s.tokens.begin() + s.num_prompt, s.tokens.end());
  ev.usage.prompt_tokens = s.num_prompt;
  ev.usage.completion_tokens = static_cast<int32_t>(ev.output_ids.size());
  ev.usage.cached_tokens = s.cached_tokens;
  events_.push_back(std::move(ev));
  if (s.state == Sequence::State::kWaiting) waiting_.erase(wait_key(s));
  forget_at_worker(s);
  free_blocks(s);
  s.finished = true;
  finished_.push_back(s.id);
}

void Scheduler::remove_finished() {
  if (finished_.empty()) return;  // the usual step: nothing to visit
  running_.erase(
      std::remove_if(running_.begin(), running_.end(), [](const Sequence* s) { return s->finished; }),
      running_.end());
  for (uint64_t id : finished_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;  // ended twice
    const int32_t slot = it->second->slot;
    seqs_.erase(it);
    slab_[static_cast<size_t>(slot)].reset();
    free_slots_.push_back(slot);
  }
  finished_.clear();
}

// Returns true when the token finished the request.
bool Scheduler::append_token(Sequence& s, const SampledToken& tok) {
  s.tokens.push_back(tok.id);
  ++counters_.tokens_generated;
  RequestEvent& ev = events_.emplace_back();  // built in place: one per token
  ev.request_id = s.id;
  ev.kind = EventKind::kToken;
  ev.token_id = tok.id;
  ev.logprob = tok.logprob;
  if (!tok.top.empty()) ev.top_logprobs = tok.top;  // a new event's is empty
  const auto received = static_cast<int32_t>(s.tokens.size()) - s.num_prompt;
  if (!s.ignore_eos && tok.id == options_.eos_id)
    end(s, FinishReason::kEos, {});
  else if (received >= s.max_tokens)
    end(s, FinishReason::kLength, {});
  else
    return false;
  return true;
}

void Scheduler::fail(Sequence& s, const std::string& error, bool retryable) {
  s.known_to_worker = false;  // a failed item's sequence is forgotten by the worker
  if (retryable && s.failures == 0) {
    ++s.failures;
    ++counters_.retries;
    to_waiting(s);
    return;
  }
  end(s, FinishReason::kError, error);
}

void Scheduler::prefetch_sequences(const std::vector<WorkRef>& work) const {
  // A step's result finds its sequences cold (the step ran meanwhile; the
  // simulator ran other workers): ask for all of their lines at once, then
  // for the ends of their token vectors, instead of one miss after another.
  for (const WorkRef& w : work) {
    const Sequence* s = slab_[static_cast<size_t>(w.slot)].get();
    if (s == nullptr) continue;
    const char* request = reinterpret_cast<const char*>(&s->request);
    for (const char* p = reinterpret_cast<const char*>(s); p < request; p += 64) __builtin_prefetch(p, 1);
  }
  for (const WorkRef& w : work) {
    const Sequence* s = slab_[static_cast<size_t>(w.slot)].get();
    if (s != nullptr && !s->tokens.empty()) __builtin_prefetch(s->tokens.data() + s->tokens.size(), 1);
  }
}

void Scheduler::prefetch_registrations(const std::vector<WorkRef>& work) {
  // The blocks this result fills go into the prefix cache: their names are
  // computed now (as register_full_blocks would) and the cache's lines for
  // them asked for, all before the first registration waits on one.
  if (!allocator_.prefix_caching()) return;
  for (const WorkRef& w : work) {
    Sequence* s = slab_[static_cast<size_t>(w.slot)].get();
    if (s == nullptr || s->id != w.seq_id || s->in_flight.empty()) continue;
    // As register_full_blocks will count them once the oldest step is in,
    // never past the blocks held (a sequence moved meanwhile).
    const int32_t full = std::min(full_blocks(*s, s->num_computed + s->in_flight.front().num_tokens),
                                  static_cast<int32_t>(s->blocks.size()));
    if (full <= s->num_registered) continue;
    ensure_hashes(*s, full);
    for (int32_t i = s->num_registered; i < full; ++i)
      allocator_.prefetch_register(s->blocks[static_cast<size_t>(i)], s->hashes[static_cast<size_t>(i)]);
  }
}

void Scheduler::on_step_done(const StepResult& result) {
  if (in_flight_steps_.empty()) throw std::invalid_argument("Scheduler::on_step_done: no step is in flight");
  const StepRecord& rec = in_flight_steps_.front();
  prefetch_sequences(rec.work);
  auto who = [&] { return "Scheduler::on_step_done: step " + std::to_string(result.step_id) + ": "; };
  if (result.step_id != rec.step_id) {
    throw std::invalid_argument(who() + "step " + std::to_string(rec.step_id) +
                                " is the oldest in flight; results must come in order");
  }
  // Check the result against the plan before changing anything: outputs in
  // plan order, one per sampling item that did not fail; failures name items.
  std::unordered_map<uint64_t, const SeqFailure*> failed;
  for (const SeqFailure& f : result.failures) {
    const bool known =
        std::any_of(rec.work.begin(), rec.work.end(), [&](const WorkRef& w) { return w.seq_id == f.seq_id; });
    if (!known || !failed.emplace(f.seq_id, &f).second) {
      throw std::invalid_argument(who() + "failure for seq " + std::to_string(f.seq_id) +
                                  ", which is not in the step or is named twice");
    }
  }
  if (!result.error.empty() &&
      (!result.outputs.empty() || !result.failures.empty() || !result.prompt_scores.empty())) {
    throw std::invalid_argument(who() + "a failed step cannot also have outputs, failures or prompt scores");
  }
  std::unordered_map<uint64_t, const PromptScores*> scores;
  if (result.error.empty() && (rec.scores || !result.prompt_scores.empty()))
    check_prompt_scores(result, rec, failed, scores);
  size_t j = 0;
  if (result.error.empty()) {
    for (const WorkRef& w : rec.work) {
      if (!w.sample || (!failed.empty() && failed.count(w.seq_id))) continue;
      if (j >= result.outputs.size()) {
        throw std::invalid_argument(who() + "no output for seq " + std::to_string(w.seq_id));
      }
      const SeqOutput& out = result.outputs[j++];
      if (out.seq_id != w.seq_id || out.token.id < 0 || out.token.id >= options_.vocab_size) {
        throw std::invalid_argument(who() + "output " + std::to_string(j - 1) + " (seq " +
                                    std::to_string(out.seq_id) + ", token " + std::to_string(out.token.id) +
                                    ") does not match the plan (seq " + std::to_string(w.seq_id) +
                                    ") or the vocabulary");
      }
    }
    if (j != result.outputs.size())
      throw std::invalid_argument(who() + "more outputs than sampling work items");
  }

  prefetch_registrations(rec.work);
  StepRecord done = std::move(in_flight_steps_.front());
  in_flight_steps_.pop_front();
  if (!result.error.empty()) ++counters_.failed_steps;
  j = 0;
  for (const WorkRef& w : done.work) {
    const SeqOutput* out = nullptr;
    if (result.error.empty() && w.sample && (failed.empty() || !failed.count(w.seq_id))) out = &result.outputs[j++];
    Sequence* slot = slab_[static_cast<size_t>(w.slot)].get();
    if (slot == nullptr || slot->id != w.seq_id) continue;  // finished, cancelled or moved meanwhile
    Sequence& s = *slot;
    if (s.finished || s.in_flight.empty() || s.in_flight.front().step_id != done.step_id) {
      continue;  // preempted or failed meanwhile: this work no longer counts
    }
    if (!result.error.empty()) {
      fail(s, "step failed on the worker: " + result.error, /*retryable=*/true);
      continue;
    }
    if (!failed.empty()) {
      if (auto f = failed.find(w.seq_id); f != failed.end()) {
        fail(s, f->second->error, f->second->retryable);
        continue;
      }
    }
    s.num_computed += s.in_flight.front().num_tokens;
    s.in_flight.pop_front();
    register_full_blocks(s);
    if (!scores.empty())
      if (auto sc = scores.find(s.id); sc != scores.end()) deliver_prompt_scores(s, *sc->second);
    if (out != nullptr) {
      append_token(s, out->token);
    } else if (s.max_tokens == 0 && s.num_computed >= s.num_prompt) {
      end(s, FinishReason::kLength, {});  // scored the whole prompt; nothing to generate
    }
  }
  spare_record_work_ = std::move(done.work);  // the next step's record
  remove_finished();
  // The next step's registrations, a whole step ahead: their tokens are all
  // known now (this step sampled the last ones), their sequences are in
  // cache, and the prefix cache's lines they need can arrive meanwhile.
  if (!in_flight_steps_.empty()) prefetch_registrations(in_flight_steps_.front().work);
}

void Scheduler::check_prompt_scores(const StepResult& result, const StepRecord& rec,
                                    const std::unordered_map<uint64_t, const SeqFailure*>& failed,
                                    std::unordered_map<uint64_t, const PromptScores*>& scores) const {
  auto who = [&] { return "Scheduler::on_step_done: step " + std::to_string(result.step_id) + ": "; };
  for (const PromptScores& p : result.prompt_scores) {
    const bool known =
        std::any_of(rec.work.begin(), rec.work.end(), [&](const WorkRef& w) { return w.seq_id == p.seq_id; });
    if (!known || !scores.emplace(p.seq_id, &p).second)
      throw std::invalid_argument(who() + "prompt scores for seq " + std::to_string(p.seq_id) +
                                  ", which is not in the step or is named twice");
    if (p.start < 1 || p.tokens.empty())
      throw std::invalid_argument(who() + "prompt scores for seq " + std::to_string(p.seq_id) +
                                  " start at position " + std::to_string(p.start) + " or hold no token");
  }
  // Each work item that counts must bring every prompt score it owes (none
  // skipped: nothing is lost silently), for the prompt's own tokens.
  for (const WorkRef& w : rec.work) {
    if (failed.count(w.seq_id)) continue;
    const Sequence* s = slab_[static_cast<size_t>(w.slot)].get();
    if (s == nullptr || s->id != w.seq_id || s->finished || s->in_flight.empty() ||
        s->in_flight.front().step_id != rec.step_id)
      continue;
    const auto sc = scores.find(w.seq_id);
    const int32_t rows = s->score_rows(s->num_computed, s->in_flight.front().num_tokens);
    const int32_t owed_to = s->num_computed + rows;  // positions up to it scored after this step
    if (sc == scores.end()) {
      if (rows > 0 && owed_to > s->prompt_scored)
        throw std::invalid_argument(who() + "no prompt scores for seq " + std::to_string(w.seq_id) +
                                    ", which asked for them");
      continue;
    }
    const PromptScores& p = *sc->second;
    const int64_t end = p.start + static_cast<int64_t>(p.tokens.size());
    if (p.start > s->prompt_scored + 1 || end - 1 < std::min(owed_to, s->num_prompt - 1) ||
        end > s->num_prompt)
      throw std::invalid_argument(who() + "prompt scores for seq " + std::to_string(w.seq_id) + " cover positions " +
                                  std::to_string(p.start) + ".." + std::to_string(end - 1) + ", not the " +
                                  std::to_string(s->prompt_scored + 1) + ".." + std::to_string(owed_to) +
                                  " it owes within its prompt of " + std::to_string(s->num_prompt));
    for (size_t i = 0; i < p.tokens.size(); ++i)
      if (p.tokens[i].id != s->tokens[static_cast<size_t>(p.start) + i])
        throw std::invalid_argument(who() + "prompt score " + std::to_string(p.start + static_cast<int64_t>(i)) +
                                    " of seq " + std::to_string(w.seq_id) + " names token " +
                                    std::to_string(p.tokens[i].id) + ", not the prompt's");
  }
}

void Scheduler::deliver_prompt_scores(Sequence& s, const PromptScores& p) {
  const int32_t from = std::max(p.start, s.prompt_scored + 1);  // a recomputed prefix was sent already
  const int32_t end = p.start + static_cast<int32_t>(p.tokens.size());
  if (from >= end) return;
  RequestEvent& ev = events_.emplace_back();
  ev.request_id = s.id;
  ev.kind = EventKind::kPromptLogprobs;
  ev.prompt_start = from;
  ev.prompt_logprobs.assign(p.tokens.begin() + (from - p.start), p.tokens.end());
  s.prompt_scored = end - 1;
}

bool Scheduler::finish(uint64_t id, FinishReason reason, const std::string& error) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  end(*it->second, reason, error);
  remove_finished();
  return true;
}

std::optional<Request> Scheduler::extract(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return std::nullopt;
  Sequence& s = *it->second;
  Request r = s.request;
  r.prompt_ids.assign(s.tokens.begin(), s.tokens.begin() + s.num_prompt);
  r.output_ids.assign(s.tokens.begin() + s.num_prompt, s.tokens.end());
  r.prompt_scored = s.prompt_scored;
  if (s.state == Sequence::State::kWaiting) waiting_.erase(wait_key(s));
  forget_at_worker(s);
  free_blocks(s);
  s.finished = true;
  finished_.push_back(s.id);
  remove_finished();
  return r;
}

std::vector<Request> Scheduler::extract_all() {
  std::vector<std::pair<uint64_t, uint64_t>> order;  // (arrival, id)
  for (const auto& [id, s] : seqs_) order.emplace_back(s->arrival, id);
  std::sort(order.begin(), order.end());
  std::vector<Request> out;
  for (const auto& [arrival, id] : order) out.push_back(*extract(id));
  return out;
}

void Scheduler::on_worker_lost() {
  in_flight_steps_.clear();
  pending_drops_.clear();
  while (!running_.empty()) {
    Sequence& s = *running_.back();
    s.known_to_worker = false;
    to_waiting(s);
  }
  for (auto& [id, s] : seqs_) s->known_to_worker = false;
  allocator_.clear_cache();
}

bool Scheduler::is_waiting(uint64_t id) const {
  auto it = seqs_.find(id);
  return it != seqs_.end() && it->second->state == Sequence::State::kWaiting;
}

bool Scheduler::is_running(uint64_t id) const {
  auto it = seqs_.find(id);
  return it != seqs_.end() && it->second->state == Sequence::State::kRunning;
}

std::vector<RequestEvent> Scheduler::take_events() {
  std::vector<RequestEvent> out;
  out.swap(events_);
  events_.reserve(out.size());  // the next step brings about as many: no growth by doubling each time
  return out;
}

void Scheduler::take_events(std::vector<RequestEvent>& out) {
  out.clear();
  out.swap(events_);
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st = counters_;
  st.num_running = num_running();
  st.num_waiting = num_waiting();
  st.steps_in_flight = steps_in_flight();
  st.blocks_used = allocator_.num_used();
  st.blocks_free = allocator_.num_free();
  st.blocks_cached = allocator_.num_cached();
  st.tokens_held = 0;
  st.slots_allocated = 0;
  for (const Sequence* s : running_) {
    st.tokens_held += s->num_scheduled();
    st.slots_allocated += static_cast<int64_t>(s->blocks.size()) * options_.block_size;
  }
  st.kv_utilization = st.slots_allocated > 0
                          ? static_cast<double>(st.tokens_held) / static_cast<double>(st.slots_allocated)
                          : 0.0;
  st.prefix_hit_blocks = allocator_.hit_blocks();
  st.prefix_miss_blocks = allocator_.miss_blocks();
  st.evictions = allocator_.evictions();
  return st;
}

}  // namespace troupe::core
