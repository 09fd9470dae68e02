#include "actors/scheduler.hpp"

#include <algorithm>
#include <stdexcept>

#include "actors/sequence.hpp"
#include "model/sampler.hpp"
#include "model/tokenizer.hpp"

namespace troupe::actors {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 (Steele et al. 2014)
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

const SchedulerOptions& checked(const SchedulerOptions& o) {
  auto bad = [](const std::string& what) {
    throw std::invalid_argument("SchedulerOptions: " + what);
  };
  if (o.num_blocks < 1) bad("num_blocks must be >= 1");
  if (o.block_size < 1) bad("block_size must be >= 1");
  if (o.max_num_batched_tokens < 1) bad("max_num_batched_tokens must be >= 1");
  if (o.max_num_seqs < 1) bad("max_num_seqs must be >= 1");
  if (o.max_model_len < 1) bad("max_model_len must be >= 1 (the model's n_positions)");
  if (o.vocab_size < 1) bad("vocab_size must be >= 1");
  if (!(o.watermark >= 0.0 && o.watermark < 1.0)) bad("watermark must be in [0, 1)");
  if (o.eos_id < -1 || o.eos_id >= o.vocab_size) bad("eos_id must be -1 or in [0, vocab_size)");
  return o;
}

void broken(const std::string& what) { throw std::logic_error("Scheduler invariant: " + what); }

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, const model::Tokenizer* tokenizer)
    : options_(checked(options)),
      tokenizer_(tokenizer),
      allocator_(options.num_blocks, options.block_size, options.enable_prefix_caching),
      watermark_blocks_(static_cast<int32_t>(options.watermark * options.num_blocks)) {}

Scheduler::~Scheduler() = default;

int32_t Scheduler::blocks_for(int64_t tokens) const {
  return static_cast<int32_t>((tokens + options_.block_size - 1) / options_.block_size);
}

Scheduler::WaitKey Scheduler::wait_key(const Sequence& s) const {
  return {s.request.priority, s.arrival, s.request.id};
}

std::optional<std::string> Scheduler::check_request(const Request& r) const {
  const auto n = static_cast<int64_t>(r.prompt_ids.size());
  const std::string id = "request " + std::to_string(r.id) + ": ";
  if (seqs_.count(r.id) != 0) return id + "id is already in use by an unfinished request";
  if (n == 0) return id + "prompt is empty";
  if (n > options_.max_model_len) {
    return id + "prompt has " + std::to_string(n) + " tokens, more than max_model_len " +
           std::to_string(options_.max_model_len);
  }
  if (r.max_tokens < 1) return id + "max_tokens must be >= 1";
  if (n + r.max_tokens > options_.max_model_len) {
    return id + "prompt (" + std::to_string(n) + ") + max_tokens (" + std::to_string(r.max_tokens) +
           ") exceeds max_model_len " + std::to_string(options_.max_model_len) +
           "; lower max_tokens";
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = r.prompt_ids[static_cast<size_t>(i)];
    if (t < 0 || t >= options_.vocab_size) {
      return id + "prompt token " + std::to_string(i) + " is id " + std::to_string(t) +
             ", outside the vocabulary [0, " + std::to_string(options_.vocab_size) + ")";
    }
  }
  try {
    model::validate(r.sampling);
  } catch (const std::invalid_argument& e) {
    return id + e.what();
  }
  if (!r.stop.empty() && tokenizer_ == nullptr) {
    return id + "stop strings need a tokenizer, and this scheduler has none";
  }
  for (const auto& s : r.stop) {
    if (s.empty()) return id + "stop strings must be non-empty";
  }
  // The last generated token is sampled, never fed back, so it takes no slot.
  const int64_t max_slots = n + r.max_tokens - 1;
  if (blocks_for(max_slots) > options_.num_blocks) {
    return id + "needs up to " + std::to_string(blocks_for(max_slots)) + " KV blocks but the pool has " +
           std::to_string(options_.num_blocks) + "; shorten the prompt or lower max_tokens";
  }
  if (!options_.enable_chunked_prefill && max_slots > options_.max_num_batched_tokens) {
    return id + "without chunked prefill up to " + std::to_string(max_slots) +
           " tokens may have to run in one step, more than max_num_batched_tokens " +
           std::to_string(options_.max_num_batched_tokens);
  }
  return std::nullopt;
}

std::optional<std::string> Scheduler::submit(Request request) {
  if (auto error = check_request(request)) return error;
  auto s = std::make_unique<Sequence>();
  s->num_prompt = static_cast<int32_t>(request.prompt_ids.size());
  s->tokens = std::move(request.prompt_ids);
  s->tokens.reserve(static_cast<size_t>(s->num_prompt) + static_cast<size_t>(request.max_tokens));
  s->request = std::move(request);
  s->request.prompt_ids.clear();
  s->request.sampling.seed =
      s->request.seed ? *s->request.seed : mix64(options_.seed ^ mix64(seed_counter_++));
  s->arrival = next_arrival_++;
  if (tokenizer_ != nullptr) s->text = std::make_unique<OutputText>(*tokenizer_, s->request.stop);
  waiting_.insert(wait_key(*s));
  const uint64_t id = s->request.id;
  seqs_.emplace(id, std::move(s));
  return std::nullopt;
}

void Scheduler::ensure_hashes(Sequence& s, int32_t full_blocks) const {
  const int32_t bs = options_.block_size;
  for (auto i = static_cast<int32_t>(s.hashes.size()); i < full_blocks; ++i) {
    const uint64_t parent = i > 0 ? s.hashes[static_cast<size_t>(i) - 1] : 0;
    s.hashes.push_back(model::BlockAllocator::hash_block(parent, s.tokens.data() + static_cast<ptrdiff_t>(i) * bs, bs));
  }
}

void Scheduler::add_chunk(Sequence& s, int32_t n, model::StepPlan& plan) {
  model::SeqChunk c;
  c.seq_id = s.request.id;
  c.start_pos = s.num_computed;
  c.token_ids.assign(s.tokens.begin() + s.num_computed, s.tokens.begin() + s.num_computed + n);
  c.block_table = s.blocks;
  c.sample = s.num_computed + n == static_cast<int32_t>(s.tokens.size());
  c.sampling = s.request.sampling;
  s.num_in_flight = n;
  s.plan_index = static_cast<int32_t>(plan.seqs.size());
  plan.seqs.push_back(std::move(c));
  planned_.push_back(&s);
}

void Scheduler::free_blocks(Sequence& s) {
  allocator_.release_all(s.blocks);
  s.blocks.clear();
  s.num_computed = 0;
  s.num_in_flight = 0;
  s.num_registered = 0;
}

void Scheduler::preempt(Sequence& s, int32_t& budget, model::StepPlan& plan) {
  if (running_.empty() || running_.back() != &s) broken("preemption victim is not the newest running sequence");
  if (s.plan_index >= 0) {  // already planned in this step: take its chunk back
    budget += s.num_in_flight;
    plan.seqs[static_cast<size_t>(s.plan_index)].token_ids.clear();
    planned_[static_cast<size_t>(s.plan_index)] = nullptr;
    s.plan_index = -1;
  }
  free_blocks(s);
  running_.pop_back();
  s.state = Sequence::State::kWaiting;
  waiting_.insert(wait_key(s));
  ++counters_.preemptions;
}

int32_t Scheduler::grow(Sequence& s, int32_t want, int32_t& budget, model::StepPlan& plan, bool& preempted) {
  const int32_t bs = options_.block_size;
  int32_t n = want;
  for (;;) {
    const auto held = static_cast<int32_t>(s.blocks.size());
    const int32_t need = blocks_for(static_cast<int64_t>(s.num_computed) + n) - held;
    const int32_t free = allocator_.num_free();
    if (need <= free) break;
    // Short of blocks: a prompt chunk shrinks to what fits; a chunk that
    // cannot take one more token preempts the newest running sequence.
    const int64_t fit = static_cast<int64_t>(held + free) * bs - s.num_computed;
    if (fit >= 1 && options_.enable_chunked_prefill) {
      n = static_cast<int32_t>(fit);
      break;
    }
    Sequence& victim = *running_.back();
    preempted = true;
    preempt(victim, budget, plan);
    if (&victim == &s) return 0;
    n = std::min(s.num_pending(), budget);
  }
  const int32_t need = blocks_for(static_cast<int64_t>(s.num_computed) + n) - static_cast<int32_t>(s.blocks.size());
  if (!allocator_.allocate(need, s.blocks)) broken("allocation failed after a successful check");
  return n;
}

bool Scheduler::try_admit(Sequence& s, int32_t& budget, model::StepPlan& plan) {
  const int32_t bs = options_.block_size;
  const auto total = static_cast<int32_t>(s.tokens.size());
  // At least the last token is computed: its logits give the next token.
  const int32_t max_hit = (total - 1) / bs;
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
    s.cached_tokens = cached;
  }
  s.state = Sequence::State::kRunning;
  running_.push_back(&s);
  add_chunk(s, n, plan);
  budget -= n;
  return true;
}

model::StepPlan Scheduler::schedule() {
  if (in_flight_) {
    throw std::logic_error("Scheduler::schedule: step " + std::to_string(in_flight_step_) +
                           " is still in flight; call on_step_done (or on_worker_lost) first");
  }
  model::StepPlan plan;
  plan.step_id = next_step_id_;
  planned_.clear();
  int32_t budget = options_.max_num_batched_tokens;
  bool preempted = false;

  // 1. Running decodes, oldest first: one token each.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    if (s.num_pending() != 1) continue;
    if (grow(s, 1, budget, plan, preempted) == 0) break;  // s was the newest: nothing after it
    add_chunk(s, 1, plan);
    budget -= 1;
  }
  // 2. Next chunks of partly prefilled prompts (Sarathi-Serve).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    if (s.plan_index >= 0 || s.num_pending() < 2) continue;
    const int32_t n = grow(s, std::min(s.num_pending(), budget), budget, plan, preempted);
    if (n == 0) break;
    add_chunk(s, n, plan);
    budget -= n;
  }
  // 3. Admissions in policy order; none in a step that had to preempt, and
  //    none past a request that does not fit (no overtaking).
  while (!preempted && !waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < options_.max_num_seqs) {
    Sequence& s = *seqs_.at(std::get<2>(*waiting_.begin()));
    if (!try_admit(s, budget, plan)) break;
  }

  // Drop chunks taken back by preemption; record what is in flight.
  size_t k = 0;
  in_flight_seqs_.clear();
  in_flight_samples_ = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sequence* s = planned_[i];
    if (s == nullptr) continue;
    s->plan_index = -1;
    s->in_flight_step = plan.step_id;
    in_flight_seqs_.emplace_back(s->request.id, plan.seqs[i].sample);
    in_flight_samples_ += plan.seqs[i].sample ? 1 : 0;
    if (k != i) plan.seqs[k] = std::move(plan.seqs[i]);
    ++k;
  }
  plan.seqs.resize(k);
  planned_.clear();
  if (!plan.seqs.empty()) {
    in_flight_ = true;
    in_flight_step_ = plan.step_id;
    ++next_step_id_;
    ++counters_.steps;
    counters_.tokens_scheduled += plan.num_tokens();
  }
  return plan;
}

void Scheduler::register_full_blocks(Sequence& s) {
  if (!allocator_.prefix_caching()) return;
  const int32_t bs = options_.block_size;
  const int32_t full = s.num_computed / bs;
  if (full <= s.num_registered) return;
  ensure_hashes(s, full);
  for (int32_t i = s.num_registered; i < full; ++i) {
    const uint64_t parent = i > 0 ? s.hashes[static_cast<size_t>(i) - 1] : 0;
    allocator_.register_block(s.blocks[static_cast<size_t>(i)], s.hashes[static_cast<size_t>(i)], parent,
                              s.tokens.data() + static_cast<ptrdiff_t>(i) * bs);
  }
  s.num_registered = full;
}

void Scheduler::finish(Sequence& s, FinishReason reason) {
  RequestEvent ev;
  ev.request_id = s.request.id;
  ev.finished = true;
  ev.finish_reason = reason;
  if (s.text && reason != FinishReason::kStop) ev.text_delta = s.text->flush();
  ev.output_ids.assign(s.tokens.begin() + s.num_prompt, s.tokens.end());
  if (s.text) ev.text = s.text->text();
  ev.usage.prompt_tokens = s.num_prompt;
  ev.usage.completion_tokens = s.num_generated();
  ev.usage.cached_tokens = s.cached_tokens;
  events_.push_back(std::move(ev));
  if (s.state == Sequence::State::kWaiting) waiting_.erase(wait_key(s));
  free_blocks(s);
}

// Returns true when the token finished the request.
bool Scheduler::append_token(Sequence& s, const model::SampledToken& tok) {
  s.tokens.push_back(tok.id);
  ++counters_.tokens_generated;
  const bool eos = !s.request.ignore_eos && tok.id == options_.eos_id;
  RequestEvent ev;
  ev.request_id = s.request.id;
  ev.token_id = tok.id;
  ev.logprob = tok.logprob;
  ev.top_logprobs = tok.top;
  if (s.text && !eos) ev.text_delta = s.text->push(tok.id);
  events_.push_back(std::move(ev));
  if (eos) finish(s, FinishReason::kEos);
  else if (s.text && s.text->stopped()) finish(s, FinishReason::kStop);
  else if (s.num_generated() >= s.request.max_tokens) finish(s, FinishReason::kLength);
  else return false;
  return true;
}

void Scheduler::on_step_done(const model::StepResult& result) {
  if (!in_flight_) throw std::invalid_argument("Scheduler::on_step_done: no step is in flight");
  if (result.step_id != in_flight_step_) {
    throw std::invalid_argument("Scheduler::on_step_done: result of step " + std::to_string(result.step_id) +
                                " but step " + std::to_string(in_flight_step_) + " is in flight");
  }
  if (static_cast<int32_t>(result.outputs.size()) != in_flight_samples_) {
    throw std::invalid_argument("Scheduler::on_step_done: step " + std::to_string(result.step_id) + " has " +
                                std::to_string(result.outputs.size()) + " outputs, the plan sampled " +
                                std::to_string(in_flight_samples_) + " sequences");
  }
  size_t j = 0;
  for (const auto& [id, sample] : in_flight_seqs_) {
    if (!sample) continue;
    const model::SeqOutput& out = result.outputs[j++];
    if (out.seq_id != id || out.token.id < 0 || out.token.id >= options_.vocab_size) {
      throw std::invalid_argument("Scheduler::on_step_done: output " + std::to_string(j - 1) + " (seq " +
                                  std::to_string(out.seq_id) + ", token " + std::to_string(out.token.id) +
                                  ") does not match the plan (seq " + std::to_string(id) +
                                  ") or the vocabulary");
    }
  }

  in_flight_ = false;
  j = 0;
  bool any_finished = false;
  for (const auto& [id, sample] : in_flight_seqs_) {
    const model::SeqOutput* out = sample ? &result.outputs[j++] : nullptr;
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;  // cancelled while in flight
    Sequence& s = *it->second;
    if (s.state != Sequence::State::kRunning || s.num_in_flight == 0 || s.in_flight_step != result.step_id) {
      continue;  // cancelled, and the id reused by a new request
    }
    s.num_computed += s.num_in_flight;
    s.num_in_flight = 0;
    register_full_blocks(s);
    if (out != nullptr && append_token(s, out->token)) {
      s.finished = true;
      any_finished = true;
    }
  }
  in_flight_seqs_.clear();
  in_flight_samples_ = 0;
  if (!any_finished) return;
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const Sequence* s) { return s->finished; }),
                 running_.end());
  for (auto it = seqs_.begin(); it != seqs_.end();) {
    it = it->second->finished ? seqs_.erase(it) : std::next(it);
  }
}

bool Scheduler::cancel(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Sequence& s = *it->second;
  if (s.state == Sequence::State::kRunning) running_.erase(std::find(running_.begin(), running_.end(), &s));
  finish(s, FinishReason::kCancelled);
  seqs_.erase(it);
  return true;
}

void Scheduler::on_worker_lost() {
  in_flight_ = false;
  in_flight_seqs_.clear();
  in_flight_samples_ = 0;
  model::StepPlan none;
  int32_t budget = 0;
  while (!running_.empty()) preempt(*running_.back(), budget, none);
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
  return out;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st = counters_;
  st.num_running = num_running();
  st.num_waiting = num_waiting();
  st.blocks_used = allocator_.num_used();
  st.blocks_free = allocator_.num_free();
  st.blocks_cached = allocator_.num_cached();
  st.tokens_held = 0;
  st.slots_allocated = 0;
  for (const Sequence* s : running_) {
    st.tokens_held += s->num_computed + s->num_in_flight;
    st.slots_allocated += static_cast<int64_t>(s->blocks.size()) * options_.block_size;
  }
  st.kv_utilization =
      st.slots_allocated > 0 ? static_cast<double>(st.tokens_held) / static_cast<double>(st.slots_allocated) : 0.0;
  st.prefix_hit_blocks = allocator_.hit_blocks();
  st.prefix_miss_blocks = allocator_.miss_blocks();
  st.evictions = allocator_.evictions();
  return st;
}

}  // namespace troupe::actors
