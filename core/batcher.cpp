#include "core/batcher.hpp"

#include <algorithm>
#include <deque>
#include <iterator>
#include <stdexcept>

namespace troupe::core {

struct Batcher::Worker {
  WorkerSpec spec;
  std::unique_ptr<Scheduler> sched;
  WorkerState state = WorkerState::kActive;
  int64_t tokens_generated = 0;
  int64_t steps = 0;
  double busy_ms = 0, idle_ms = 0;
  std::deque<int64_t> deadlines;  // per step in flight, oldest first: how long it may be the oldest, ns
  int64_t oldest_since = 0;       // when the oldest step in flight became the oldest
  size_t index = 0;               // in order_ and board_
  int32_t fit_class = 0;          // in fit_classes_
  Lane* lane = nullptr;           // while a lane call runs on it: where its root changes go
  int32_t load() const { return sched->num_running() + sched->num_waiting(); }
};

namespace {

// Whether two workers' options give every request the same Scheduler::fits answer.
bool same_fit(const SchedulerOptions& a, const SchedulerOptions& b) {
  return a.max_model_len == b.max_model_len && a.num_blocks == b.num_blocks && a.block_size == b.block_size &&
         a.enable_chunked_prefill == b.enable_chunked_prefill &&
         a.max_num_batched_tokens == b.max_num_batched_tokens;
}

}  // namespace

Batcher::Worker* Batcher::find(uint64_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

void Batcher::refresh(const Worker& w) {
  Candidate& c = board_[w.index];
  c.id = w.spec.id;
  c.load = w.load();
  c.free = w.sched->allocator().num_free();
  c.fit_class = w.fit_class;
  c.active = w.state == WorkerState::kActive;
}

void Batcher::rebuild_order() {
  order_.clear();
  by_id_.clear();
  for (auto& [wid, wk] : workers_) {
    wk->index = order_.size();
    order_.push_back(wk.get());
    by_id_.emplace(wid, wk.get());
  }
  board_.assign(order_.size(), Candidate{});
  for (const Worker* w : order_) refresh(*w);
}

void Batcher::check_invariants() const {
  if (board_.size() != order_.size() || order_.size() != workers_.size() || by_id_.size() != workers_.size())
    throw std::logic_error("Batcher: the placement board's size disagrees with the workers");
  for (size_t i = 0; i < order_.size(); ++i) {
    const Worker& w = *order_[i];
    const Candidate& c = board_[i];
    if (w.index != i || find(w.spec.id) != &w || c.id != w.spec.id || c.load != w.load() || c.free != w.sched->allocator().num_free() ||
        c.fit_class != w.fit_class || c.active != (w.state == WorkerState::kActive) ||
        !same_fit(fit_classes_[static_cast<size_t>(c.fit_class)], w.spec.scheduler))
      throw std::logic_error("Batcher: the placement board disagrees with worker " + std::to_string(w.spec.id));
  }
}

const char* to_string(WorkerExit why) {
  switch (why) {
    case WorkerExit::kDrained:
      return "drained";
    case WorkerExit::kLost:
      return "lost";
    case WorkerExit::kHung:
      return "hung";
    case WorkerExit::kBroken:
      return "broken";
  }
  return "unknown";
}

const char* to_string(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kRoundRobin:
      return "round-robin";
    case PlacementPolicy::kLeastLoaded:
      return "least-loaded";
    case PlacementPolicy::kPrefixAffinity:
      return "prefix-affinity";
  }
  return "unknown";
}

PlacementPolicy parse_placement(const std::string& text) {
  for (auto p :
       {PlacementPolicy::kRoundRobin, PlacementPolicy::kLeastLoaded, PlacementPolicy::kPrefixAffinity}) {
    if (text == to_string(p)) return p;
  }
  throw std::invalid_argument("placement must be round-robin, least-loaded or prefix-affinity, got '" + text +
                              "'");
}

Batcher::Batcher(const BatcherOptions& options) : options_(options) {
  if (options.unplaced_timeout_ns <= 0)
    throw std::invalid_argument("BatcherOptions: unplaced_timeout_ns must be > 0");
  if (options.max_unplaced < 0) throw std::invalid_argument("BatcherOptions: max_unplaced must be >= 0");
  if (options.step_timeout_floor_ns < 0 || options.step_timeout_cold_ns < 0 ||
      !(options.step_timeout_margin >= 1.0)) {
    throw std::invalid_argument("BatcherOptions: step timeouts must be >= 0 and the margin >= 1");
  }
}

Batcher::~Batcher() = default;

std::optional<std::string> Batcher::add_worker(const WorkerSpec& spec) {
  if (workers_.count(spec.id)) return "worker " + std::to_string(spec.id) + " is already a member";
  if (spec.id == 0) return std::string("worker id 0 is reserved");
  for (const auto& [id, w] : workers_) {
    const SchedulerOptions& o = w->spec.scheduler;
    if (o.vocab_size != spec.scheduler.vocab_size || o.eos_id != spec.scheduler.eos_id) {
      return "worker " + std::to_string(spec.id) + " serves another model (vocabulary " +
             std::to_string(spec.scheduler.vocab_size) + ", eos " + std::to_string(spec.scheduler.eos_id) +
             ") than worker " + std::to_string(id);
    }
  }
  auto w = std::make_unique<Worker>();
  w->spec = spec;
  try {
    w->sched = std::make_unique<Scheduler>(spec.scheduler);
  } catch (const std::invalid_argument& e) {
    return "worker " + std::to_string(spec.id) + ": " + e.what();
  }
  w->sched->set_root_observer(
      [this, wp = w.get()](const int32_t* tokens, bool cached) { root_changed(*wp, tokens, cached); });
  auto cls = std::find_if(fit_classes_.begin(), fit_classes_.end(),
                          [&](const SchedulerOptions& o) { return same_fit(o, spec.scheduler); });
  if (cls == fit_classes_.end()) cls = fit_classes_.insert(fit_classes_.end(), spec.scheduler);
  w->fit_class = static_cast<int32_t>(cls - fit_classes_.begin());
  workers_.emplace(spec.id, std::move(w));
  rebuild_order();
  return std::nullopt;
}

void Batcher::apply_root_change(uint64_t worker, const int32_t* tokens, int32_t n, bool cached) {
  if (cached)
    roots_->add(worker, tokens, n);
  else
    roots_->remove(worker, tokens, n);
}

void Batcher::root_changed(Worker& w, const int32_t* tokens, bool cached) {
  const int32_t bs = w.spec.scheduler.block_size;
  if (w.lane == nullptr) return apply_root_change(w.spec.id, tokens, bs, cached);
  Lane& l = *w.lane;
  l.roots_.push_back({w.spec.id, cached, bs, l.root_tokens_.size()});
  l.root_tokens_.insert(l.root_tokens_.end(), tokens, tokens + bs);
}

void Batcher::collect(Worker& w, Lane* lane) {
  std::vector<RequestEvent>& got = lane ? lane->collected_ : collected_;
  std::vector<RequestEvent>& to = lane ? lane->events : events_;
  w.sched->take_events(got);
  for (const RequestEvent& ev : got) {
    if (ev.kind == EventKind::kToken) ++w.tokens_generated;
    if (!ev.finished()) continue;
    if (lane)
      lane->finished_.push_back(ev.request_id);
    else
      where_.erase(ev.request_id);
  }
  if (to.empty()) {
    to.swap(got);  // the usual case: one worker's step since the last take_events()
    return;
  }
  to.insert(to.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
}

Batcher::Worker* Batcher::pick(const Request& r) {
  // Every request placed here passed check() on some worker (submit), and
  // all workers serve one model: fits() asks the rest (from their options,
  // which are their schedulers'), once per class of alike workers.
  class_fits_.resize(fit_classes_.size());
  for (size_t k = 0; k < fit_classes_.size(); ++k) class_fits_[k] = Scheduler::fits(fit_classes_[k], r);
  const auto fits = [this](const Candidate& c) {
    return c.active && class_fits_[static_cast<size_t>(c.fit_class)];
  };
  // Least loaded first: fewer sequences, then more free blocks, as one key
  // (both are >= 0); ties go to the lower id (the board's order).
  const auto key = [](const Candidate& c) {
    return static_cast<uint64_t>(static_cast<uint32_t>(c.load)) << 32 |
           (0xffffffffULL - static_cast<uint32_t>(c.free));
  };
  constexpr size_t kNone = static_cast<size_t>(-1);
  if (options_.placement == PlacementPolicy::kRoundRobin) {
    // The first fitting worker whose id is >= the cursor, wrapping around.
    size_t first = kNone, at = kNone;
    for (size_t i = 0; i < board_.size() && at == kNone; ++i) {
      if (!fits(board_[i])) continue;
      if (first == kNone) first = i;
      if (board_[i].id >= rr_next_) at = i;
    }
    if (first == kNone) return nullptr;
    const size_t i = at != kNone ? at : first;
    rr_next_ = board_[i].id + 1;
    return order_[i];
  }
  // One pass over the board: the least loaded fitting worker.
  size_t best = kNone;
  uint64_t best_key = ~0ULL;
  for (size_t i = 0; i < board_.size(); ++i) {
    const Candidate& c = board_[i];
    if (!fits(c)) continue;
    if (const uint64_t k = key(c); k < best_key) {
      best_key = k;
      best = i;
    }
  }
  if (best == kNone) return nullptr;
  if (options_.placement == PlacementPolicy::kLeastLoaded) return order_[best];
  // Prefix affinity: the most cached blocks, then the least loaded, then the
  // lowest id. Only a worker caching the first block can have a hit: the
  // index names them (per block size); the rest have none (so without a hit
  // anywhere it is the least loaded worker above).
  std::vector<int32_t> joined;  // the prompt, then what was generated before (a moved request)
  if (!r.output_ids.empty()) {
    joined.reserve(r.prompt_ids.size() + r.output_ids.size());
    joined = r.prompt_ids;
    joined.insert(joined.end(), r.output_ids.begin(), r.output_ids.end());
  }
  const std::vector<int32_t>& tokens = r.output_ids.empty() ? r.prompt_ids : joined;
  int32_t best_hit = 0;
  for (size_t k = 0; k < fit_classes_.size(); ++k) {
    const int32_t bs = fit_classes_[k].block_size;
    if (!class_fits_[k] || tokens.size() <= static_cast<size_t>(bs)) continue;
    const bool seen = std::any_of(fit_classes_.begin(), fit_classes_.begin() + static_cast<ptrdiff_t>(k),
                                  [&](const SchedulerOptions& o) { return o.block_size == bs; });
    if (seen) continue;  // (each block size's holders once)
    const std::vector<uint64_t>* holders = roots_->holders(tokens.data(), bs);
    if (holders == nullptr) continue;
    for (uint64_t id : *holders) {
      const Worker* w = find(id);
      if (w == nullptr) continue;
      const Candidate& c = board_[w->index];
      if (!fits(c) || fit_classes_[static_cast<size_t>(c.fit_class)].block_size != bs) continue;
      const int32_t hit = w->sched->cached_prefix_blocks(tokens);
      const uint64_t k2 = key(c);
      if (hit > best_hit ||
          (hit == best_hit && hit > 0 && (k2 < best_key || (k2 == best_key && w->index < best)))) {
        best = w->index;
        best_hit = hit;
        best_key = k2;
      }
    }
  }
  return order_[best];
}

// Queues r on the best worker that can run it; false when none can now.
bool Batcher::place(Request& r, int64_t now) {
  (void)now;
  Worker* w = pick(r);
  if (w == nullptr) return false;
  const uint64_t id = r.id;
  if (auto err = w->sched->submit(std::move(r))) {
    throw std::logic_error("Batcher: a worker refused a request its check() accepted: " + *err);
  }
  refresh(*w);
  where_[id] = w->spec.id;
  return true;
}

std::optional<std::string> Batcher::refused_by_all(const Request& r) const {
  std::optional<std::string> why;
  for (const auto& [id, w] : workers_) {
    auto err = w->sched->check(r);
    if (!err) return std::nullopt;
    if (!why) why = err;
  }
  return why;
}

void Batcher::fail_unplaced(const Request& r, const std::string& error, FinishReason reason) {
  RequestEvent ev;
  ev.request_id = r.id;
  ev.kind = EventKind::kFinished;
  ev.finish_reason = reason;
  ev.error = error;
  ev.output_ids = r.output_ids;
  ev.usage.prompt_tokens = static_cast<int32_t>(r.prompt_ids.size());
  ev.usage.completion_tokens = static_cast<int32_t>(r.output_ids.size());
  events_.push_back(std::move(ev));
  where_.erase(r.id);
}

std::optional<std::string> Batcher::refusal(const Request& request) const {
  if (where_.count(request.id))
    return "request " + std::to_string(request.id) + ": id is already in use by an unfinished request";
  // Refuse what no live worker could ever run; with none live, wait.
  return refused_by_all(request);
}

std::optional<std::string> Batcher::submit(Request request, int64_t now) {
  if (auto why = refusal(request)) return why;
  if (place(request, now)) return std::nullopt;
  if (static_cast<int32_t>(unplaced_.size()) >= options_.max_unplaced) {
    return "request " + std::to_string(request.id) + ": no worker can take it now and " +
           std::to_string(unplaced_.size()) + " requests already wait for one";
  }
  where_[request.id] = 0;
  unplaced_.push_back({std::move(request), now + options_.unplaced_timeout_ns});
  return std::nullopt;
}

std::optional<std::string> Batcher::choose(const Request& request, uint64_t& worker) {
  if (auto why = refusal(request)) return why;
  const Worker* w = pick(request);
  if (w == nullptr)
    return "request " + std::to_string(request.id) +
           ": no worker can take it now (a lane's run keeps no request waiting)";
  worker = w->spec.id;
  where_[request.id] = worker;
  return std::nullopt;
}

// A lane call on one worker: checks it may run (lane_worker) and sends the
// worker's root changes to the lane while it runs.
class Batcher::LaneCall {
 public:
  LaneCall(const Batcher& b, uint64_t worker, const char* what, Lane& lane)
      : w_(*b.lane_worker(worker, what)) {
    w_.lane = &lane;
  }
  ~LaneCall() { w_.lane = nullptr; }
  LaneCall(const LaneCall&) = delete;
  LaneCall& operator=(const LaneCall&) = delete;
  Worker& worker() const { return w_; }

 private:
  Worker& w_;
};

void Batcher::admit(uint64_t worker, Request request, Lane& lane) {
  const LaneCall call(*this, worker, "admit", lane);
  if (auto err = call.worker().sched->submit(std::move(request)))
    throw std::logic_error("Batcher: a worker refused a request its check() accepted: " + *err);
  refresh(call.worker());
}

bool Batcher::finish(uint64_t id, FinishReason reason, const std::string& error) {
  auto it = where_.find(id);
  if (it == where_.end()) return false;
  if (it->second != 0) {
    Worker& w = *find(it->second);  // where_ names live workers only
    w.sched->finish(id, reason, error);
    refresh(w);
    collect(w);
    return true;
  }
  auto u =
      std::find_if(unplaced_.begin(), unplaced_.end(), [&](const Unplaced& x) { return x.request.id == id; });
  if (u != unplaced_.end()) {
    fail_unplaced(u->request, error, reason);
    unplaced_.erase(u);
  }
  where_.erase(id);
  return true;
}

void Batcher::move_all(Worker& w, int64_t now) {
  std::vector<Request> moving = w.sched->extract_all();
  collect(w);
  for (Request& r : moving) {
    ++counters_.requests_moved;
    counters_.tokens_recomputed += static_cast<int64_t>(r.prompt_ids.size() + r.output_ids.size());
    where_.erase(r.id);
    const uint64_t id = r.id;
    if (place(r, now)) continue;
    where_[id] = 0;
    unplaced_.push_back({std::move(r), now + options_.unplaced_timeout_ns});
  }
}

bool Batcher::remove_worker(uint64_t id, int64_t now, WorkerExit why) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  switch (why) {
    case WorkerExit::kDrained:
      break;
    case WorkerExit::kLost:
      ++counters_.workers_lost;
      break;
    case WorkerExit::kHung:
      ++counters_.workers_hung;
      break;
    case WorkerExit::kBroken:
      ++counters_.workers_broken;
      break;
  }
  std::unique_ptr<Worker> w = std::move(it->second);
  workers_.erase(it);
  rebuild_order();
  roots_->remove_worker(id);
  w->sched->set_root_observer(nullptr);  // its cache is no candidate any more
  move_all(*w, now);                     // the others are the only candidates now
  return true;
}

bool Batcher::drain_worker(uint64_t id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  Worker& w = *it->second;
  w.state = WorkerState::kDraining;
  refresh(w);
  // Requests it has not started go where they can start; if nowhere, they stay.
  std::vector<uint64_t> waiting;
  for (const auto& [rid, wid] : where_) {
    if (wid == id && w.sched->is_waiting(rid)) waiting.push_back(rid);
  }
  std::sort(waiting.begin(), waiting.end());
  for (uint64_t rid : waiting) {
    std::optional<Request> r = w.sched->extract(rid);
    if (!r) continue;
    refresh(w);
    Worker* other = pick(*r);
    Worker& to = other == nullptr ? w : *other;  // nowhere else: it runs here after all
    if (auto err = to.sched->submit(std::move(*r))) {
      throw std::logic_error("Batcher: a worker refused a request it was moved to: " + *err);
    }
    refresh(to);
    if (other != nullptr) where_[rid] = other->spec.id;
  }
  collect(w);
  return true;
}

bool Batcher::drained(uint64_t id) const {
  const Worker* w = find(id);
  return w == nullptr || !w->sched->has_unfinished();
}

std::optional<std::string> Batcher::on_result(uint64_t worker, const StepResult& result, int64_t now) {
  Worker* found = find(worker);
  if (found == nullptr) return std::nullopt;  // a late result from a worker already removed
  Worker& w = *found;
  try {
    w.sched->on_step_done(result);
    refresh(w);
  } catch (const std::invalid_argument& e) {
    const std::string why =
        "worker " + std::to_string(worker) + " sent a result that does not fit its plan: " + e.what();
    remove_worker(worker, now, WorkerExit::kBroken);
    return why;
  }
  took_result(w, result, now);
  collect(w);
  return std::nullopt;
}

Batcher::Worker* Batcher::lane_worker(uint64_t id, const char* what) const {
  if (!unplaced_.empty())
    throw std::logic_error(std::string("Batcher::") + what + " in a lane: requests wait for a worker");
  Worker* w = find(id);
  if (w == nullptr) throw std::logic_error(std::string("Batcher::") + what + " in a lane: unknown worker");
  return w;
}

std::optional<std::string> Batcher::on_result(uint64_t worker, const StepResult& result, int64_t now,
                                              Lane& lane) {
  const LaneCall call(*this, worker, "on_result", lane);
  Worker& w = call.worker();
  try {
    w.sched->on_step_done(result);
  } catch (const std::invalid_argument& e) {
    return "worker " + std::to_string(worker) + " sent a result that does not fit its plan: " + e.what();
  }
  refresh(w);
  took_result(w, result, now);
  collect(w, &lane);
  return std::nullopt;
}

void Batcher::schedule(int64_t now, uint64_t worker, std::vector<Dispatch>& out, Lane& lane) {
  out.clear();
  const LaneCall call(*this, worker, "schedule", lane);
  plan(worker, call.worker(), now, out, &lane);
}

void Batcher::merge(Lane& lane) {
  for (uint64_t id : lane.finished_) where_.erase(id);
  lane.finished_.clear();
  for (const Lane::RootChange& c : lane.roots_)
    apply_root_change(c.worker, lane.root_tokens_.data() + c.offset, c.n, c.cached);
  lane.roots_.clear();
  lane.root_tokens_.clear();
}

void Batcher::took_result(Worker& w, const StepResult& result, int64_t now) {
  ++w.steps;
  w.busy_ms += result.forward_ms;
  w.idle_ms += result.idle_ms;
  if (!w.deadlines.empty()) {
    w.deadlines.pop_front();
    w.oldest_since = now;  // the next step in flight was queued at the worker: it starts now
    if (w.spec.cost) w.spec.cost->observe(result.step_id, result.forward_ms);
  }
}

int64_t Batcher::step_deadline(Worker& w, const StepPlan& plan) const {
  const int64_t predicted = w.spec.cost ? w.spec.cost->predict_ns(plan) : 0;
  const int64_t floor = options_.step_timeout_floor_ns;
  if (predicted <= 0) return std::max(floor, options_.step_timeout_cold_ns);
  return std::max(floor, static_cast<int64_t>(options_.step_timeout_margin * static_cast<double>(predicted)));
}

std::vector<HungWorker> Batcher::take_hung(int64_t now) {
  std::vector<HungWorker> hung;
  if (options_.step_timeout_floor_ns <= 0) return hung;
  for (const auto& [id, w] : workers_) {
    if (w->deadlines.empty()) continue;
    const int64_t running = now - w->oldest_since;
    if (running > w->deadlines.front())
      hung.push_back({id, w->sched->oldest_step_in_flight(), running, w->deadlines.front()});
  }
  for (const HungWorker& h : hung) remove_worker(h.worker, now, WorkerExit::kHung);
  return hung;
}

void Batcher::place_unplaced(int64_t now, std::vector<uint64_t>& placed) {
  // Unplaced requests, in arrival order: past the deadline they fail; the
  // first worker that fits takes them; if every worker refuses one, it fails.
  if (unplaced_.empty()) return;
  std::vector<Unplaced> pending;
  pending.swap(unplaced_);
  for (Unplaced& u : pending) {
    if (u.deadline <= now) {
      fail_unplaced(u.request, "no worker could run request " + std::to_string(u.request.id) +
                                   " before its deadline (" + std::to_string(workers_.size()) + " workers)");
    } else if (auto why = refused_by_all(u.request)) {
      fail_unplaced(u.request, *why);
    } else if (const uint64_t id = u.request.id; place(u.request, now)) {
      placed.push_back(where_.at(id));
    } else {
      unplaced_.push_back(std::move(u));
    }
  }
}

void Batcher::plan(uint64_t id, Worker& w, int64_t now, std::vector<Dispatch>& out, Lane* lane) {
  while (w.sched->can_schedule()) {
    StepPlan plan = w.sched->schedule();
    if (plan.empty()) break;
    if (options_.step_timeout_floor_ns > 0) {
      if (w.deadlines.empty()) w.oldest_since = now;
      w.deadlines.push_back(step_deadline(w, plan));
    }
    out.push_back({id, std::move(plan)});
  }
  refresh(w);
  collect(w, lane);
}

std::vector<Dispatch> Batcher::schedule(int64_t now) {
  ids_.clear();
  place_unplaced(now, ids_);
  std::vector<Dispatch> out;
  for (auto& [id, w] : workers_) plan(id, *w, now, out);
  return out;
}

std::vector<Dispatch> Batcher::schedule(int64_t now, uint64_t worker) {
  std::vector<Dispatch> out;
  schedule(now, worker, out);
  return out;
}

void Batcher::schedule(int64_t now, uint64_t worker, std::vector<Dispatch>& out) {
  out.clear();
  ids_.clear();
  place_unplaced(now, ids_);
  ids_.push_back(worker);
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  for (uint64_t id : ids_) {
    if (Worker* w = find(id)) plan(id, *w, now, out);
  }
}

std::optional<int64_t> Batcher::next_deadline() const {
  std::optional<int64_t> d;
  for (const Unplaced& u : unplaced_) d = d ? std::min(*d, u.deadline) : u.deadline;
  return d;
}

std::vector<RequestEvent> Batcher::take_events() {
  std::vector<RequestEvent> out;
  out.swap(events_);
  return out;
}

void Batcher::take_events(std::vector<RequestEvent>& out) {
  out.clear();
  out.swap(events_);
}

int32_t Batcher::num_waiting() const {
  int32_t n = static_cast<int32_t>(unplaced_.size());
  for (const auto& [id, w] : workers_) n += w->sched->num_waiting();
  return n;
}

int32_t Batcher::num_running() const {
  int32_t n = 0;
  for (const auto& [id, w] : workers_) n += w->sched->num_running();
  return n;
}

std::vector<WorkerStats> Batcher::worker_stats() const {
  std::vector<WorkerStats> out;
  for (const auto& [id, w] : workers_) {
    out.push_back({id, w->spec.node, w->spec.device, w->state, w->sched->stats(), w->tokens_generated,
                   w->steps, w->busy_ms, w->idle_ms});
  }
  return out;
}

uint64_t Batcher::worker_of(uint64_t request_id) const {
  auto it = where_.find(request_id);
  return it == where_.end() ? 0 : it->second;
}

const Scheduler* Batcher::scheduler(uint64_t worker) const {
  const Worker* w = find(worker);
  return w == nullptr ? nullptr : w->sched.get();
}

}  // namespace troupe::core
