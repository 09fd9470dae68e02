#pragma once
// Drives a Scheduler with a scripted worker (no model): the token sampled at
// position p of sequence `id` is script(id, p), so a request's output is known
// in advance and survives preemption, recompute and moves unchanged.
//
// The fake worker is a real core::SequenceTable (the worker's per-sequence
// state), so every plan is checked the way a worker checks it: a work item it
// refuses fails the test unless the test expects failures. It runs each plan
// as soon as it is planned (as a worker runs its queue in order) and holds
// the results until deliver() hands the oldest back, so tests can keep two
// steps in flight.
//
// It also keeps a shadow KV pool: every slot remembers a hash of the whole
// prefix whose K/V it holds. Before a chunk runs, every slot its block table
// maps for positions [0, start_pos) must hold exactly the prefix of that
// sequence; a chunk may only write slots of blocks it owns alone. So a wrong
// prefix-cache hit, an eviction of a live block or a lost token fails the
// test even though no real K/V exist.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/scheduler.hpp"
#include "core/sequence_table.hpp"
#include "core/splitmix.hpp"

namespace troupe::core::test {

inline uint64_t mix(uint64_t h, uint64_t v) { return splitmix64(h ^ (v + (h << 6) + (h >> 2))); }

inline Request make_request(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  Request r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

inline std::vector<int32_t> range_tokens(int32_t n, int32_t from = 1) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(from + i);
  return t;
}

// A work item in short: (seq, start_pos, tokens, sample).
struct ChunkView {
  uint64_t id;
  int32_t start;
  int32_t n;
  bool sample;
  bool operator==(const ChunkView& o) const {
    return id == o.id && start == o.start && n == o.n && sample == o.sample;
  }
};
inline std::ostream& operator<<(std::ostream& os, const ChunkView& c) {
  return os << "{seq " << c.id << " start " << c.start << " n " << c.n << (c.sample ? " sample}" : "}");
}
inline std::vector<ChunkView> view(const StepPlan& plan) {
  std::vector<ChunkView> v;
  for (const auto& w : plan.work) v.push_back({w.seq_id, w.start_pos, w.num_tokens, w.sample});
  return v;
}

inline SequenceTableOptions table_options(const SchedulerOptions& o) {
  SequenceTableOptions t;
  t.num_blocks = o.num_blocks;
  t.block_size = o.block_size;
  t.max_positions = o.max_model_len;
  t.vocab_size = o.vocab_size;
  return t;
}

class Harness {
 public:
  using Script = std::function<int32_t(uint64_t id, int32_t pos)>;

  explicit Harness(const SchedulerOptions& o)
      : opts(o),
        sched(o),
        worker(table_options(o)),
        kv(static_cast<size_t>(o.num_blocks) * o.block_size, 0) {}

  SchedulerOptions opts;
  Scheduler sched;
  SequenceTable worker;
  // Never eos by default (ids < 50000).
  Script script = [](uint64_t id, int32_t pos) {
    return static_cast<int32_t>((id * 7919 + static_cast<uint64_t>(pos) * 31) % 50000);
  };
  bool expect_worker_failures = false;                   // false: a refused work item fails the test
  std::map<uint64_t, std::vector<int32_t>> tokens;       // id -> prompt + outputs received
  std::map<uint64_t, std::vector<RequestEvent>> events;  // id -> its events
  std::map<uint64_t, int32_t> finals;                    // id -> final events seen
  std::map<uint64_t, size_t> tokens_at_submit;           // id -> prompt + outputs it came with
  std::vector<uint64_t> kv;                              // slot -> prefix hash (0 = never written)
  int64_t steps_with_preemption = 0;
  // When set: a second table that follows every plan through
  // SequenceTable::advance (a worker without a model: one pass, no chunks)
  // and must refuse what `worker` refuses and hold what it holds after every
  // step, faults included.
  std::optional<SequenceTable> shadow;
  PreparedStep last;               // what the worker ran for the newest plan
  std::deque<StepResult> results;  // run on the worker, not yet delivered
  // Faults for the next step the worker runs: the whole step fails (the
  // worker forgets its sequences, its KV writes are garbage), or these
  // sequences' work items fail.
  bool fail_next_step = false;
  std::set<uint64_t> fail_seqs_next;
  bool fail_retryable = true;
  bool drop_prompt_scores_next = false;  // the worker leaves out the prompt scores it owes
  // Prompt logprobs received, by request: (position, token id) in arrival
  // order, checked on arrival to continue without a gap or a repeat.
  std::map<uint64_t, std::vector<std::pair<int32_t, int32_t>>> prompt_scores;
  // The made-up logprob the fake worker gives prompt position `pos`.
  static float prompt_logprob(int32_t pos) { return -0.01f * static_cast<float>(pos); }

  std::optional<std::string> submit(Request r) {
    const uint64_t id = r.id;
    auto history = r.prompt_ids;
    history.insert(history.end(), r.output_ids.begin(), r.output_ids.end());
    auto err = sched.submit(std::move(r));
    if (!err) {
      tokens_at_submit[id] = history.size();
      tokens[id] = history;  // a reused id starts a new history
      events[id].clear();
      prompt_scores[id].clear();
      finals[id] = 0;
    }
    sched.check_invariants();
    return err;
  }

  // A request taken out of a scheduler (extract) and queued again: its history
  // and events go on.
  std::optional<std::string> resubmit(Request r) {
    const uint64_t id = r.id;
    auto history = r.prompt_ids;
    history.insert(history.end(), r.output_ids.begin(), r.output_ids.end());
    auto err = sched.submit(std::move(r));
    if (!err) tokens[id] = history;
    sched.check_invariants();
    return err;
  }

  bool cancel(uint64_t id) {
    bool ok = sched.cancel(id);
    sched.check_invariants();
    drain();
    return ok;
  }

  // Plans, runs and delivers one step; returns the plan.
  StepPlan step() {
    StepPlan plan = plan_and_run();
    if (!plan.empty()) deliver();
    return plan;
  }

  // Plans a step, checks it and runs it on the fake worker; its result waits
  // in `results` until deliver().
  StepPlan plan_and_run() {
    std::set<uint64_t> waiting_before;
    for (const auto& [id, t] : tokens) {
      if (sched.is_waiting(id)) waiting_before.insert(id);
    }
    const int64_t preempted_before = sched.stats().preemptions;
    StepPlan plan = sched.schedule();
    sched.check_invariants();
    if (plan.empty()) return plan;
    check_plan(plan, waiting_before, sched.stats().preemptions > preempted_before);
    results.push_back(run_on_worker(plan));
    return plan;
  }

  // Hands the oldest result to the scheduler.
  void deliver() {
    ASSERT_FALSE(results.empty()) << "no result to deliver";
    StepResult r = std::move(results.front());
    results.pop_front();
    sched.on_step_done(r);
    sched.check_invariants();
    drain();
  }

  // What the worker does with a plan: SequenceTable bookkeeping, the shadow
  // KV reads and writes, one scripted token per sampling chunk.
  StepResult run_on_worker(const StepPlan& plan) {
    last = worker.prepare(plan);
    if (!expect_worker_failures) {
      for (const auto& f : last.failures) ADD_FAILURE() << "worker refused: " << f.error;
    }
    if (shadow) {
      std::vector<SeqFailure> refused;
      EXPECT_EQ(shadow->advance(plan, refused, script), last.failures.empty());
      EXPECT_EQ(refused.size(), last.failures.size());
      for (size_t i = 0; i < std::min(refused.size(), last.failures.size()); ++i) {
        EXPECT_EQ(refused[i].seq_id, last.failures[i].seq_id);
        EXPECT_EQ(refused[i].error, last.failures[i].error);
        EXPECT_EQ(refused[i].retryable, last.failures[i].retryable);
      }
    }
    StepResult r;
    r.step_id = plan.step_id;
    const int32_t bs = opts.block_size;
    if (fail_next_step) {
      fail_next_step = false;
      for (const auto& c : last.chunks) {  // a forward that died half way: garbage in its slots
        for (int32_t p = c.start_pos; p < c.start_pos + static_cast<int32_t>(c.token_ids.size()); ++p) {
          kv[static_cast<size_t>(c.block_table[static_cast<size_t>(p / bs)]) * bs + p % bs] = 0xdeadbeef;
        }
      }
      worker.abort(last);
      if (shadow) {
        shadow->abort(last);  // (it forgets the sequences the step ran: the chunks' ids)
        check_shadow(plan);
      }
      r.error = "injected: the forward pass failed";
      return r;
    }
    r.failures = last.failures;
    std::vector<uint64_t> failed;
    for (const auto& c : last.chunks) {
      // Blocks written by this chunk: owned alone and not cached (checked
      // against the allocator as planned, so run right after schedule()).
      for (int32_t p = c.start_pos; p < c.start_pos + static_cast<int32_t>(c.token_ids.size()); ++p) {
        const int32_t b = c.block_table[static_cast<size_t>(p / bs)];
        EXPECT_EQ(sched.allocator().ref_count(b), 1) << "seq " << c.seq_id << " writes shared block " << b;
        EXPECT_FALSE(sched.allocator().is_cached(b)) << "seq " << c.seq_id << " writes cached block " << b;
      }
      execute(c);
      if (!c.score_ids.empty() && !drop_prompt_scores_next) {
        PromptScores& p = r.prompt_scores.emplace_back();
        p.seq_id = c.seq_id;
        p.start = c.start_pos + 1;
        for (size_t i = 0; i < c.score_ids.size(); ++i)
          p.tokens.push_back({c.score_ids[i], prompt_logprob(p.start + static_cast<int32_t>(i)), {}, 1});
      }
      if (fail_seqs_next.count(c.seq_id)) {
        failed.push_back(c.seq_id);
        r.failures.push_back(
            {c.seq_id, "injected: seq " + std::to_string(c.seq_id) + " failed", fail_retryable});
        continue;
      }
      if (!c.sample) continue;
      SeqOutput out;
      out.seq_id = c.seq_id;
      out.token.id = script(c.seq_id, c.start_pos + static_cast<int32_t>(c.token_ids.size()));
      r.outputs.push_back(out);
    }
    fail_seqs_next.clear();
    drop_prompt_scores_next = false;
    if (!failed.empty()) {  // a failed item brings no scores either
      auto& ps = r.prompt_scores;
      ps.erase(std::remove_if(ps.begin(), ps.end(),
                              [&](const PromptScores& p) {
                                return std::find(failed.begin(), failed.end(), p.seq_id) != failed.end();
                              }),
               ps.end());
    }
    worker.commit(last, r.outputs, failed);
    if (shadow) {
      PreparedStep gone;  // the failed items' sequences, which commit() forgot
      for (uint64_t id : failed) gone.chunks.emplace_back().seq_id = id;
      shadow->abort(gone);
      check_shadow(plan);
    }
    return r;
  }

  // The shadow table holds what the worker's holds for every sequence the
  // plan named.
  void check_shadow(const StepPlan& plan) {
    EXPECT_EQ(shadow->size(), worker.size());
    auto same = [&](uint64_t id) {
      EXPECT_EQ(shadow->contains(id), worker.contains(id)) << "seq " << id;
      EXPECT_EQ(shadow->num_computed(id), worker.num_computed(id)) << "seq " << id;
      EXPECT_EQ(shadow->tokens(id), worker.tokens(id)) << "seq " << id;
    };
    for (const SeqWork& w : plan.work) same(w.seq_id);
    for (const NewSequence& n : plan.new_seqs) same(n.seq_id);
    for (uint64_t id : plan.drop) same(id);
  }

  // Writes a chunk's K/V into the shadow pool after checking what it reads.
  void execute(const SeqChunk& c) {
    const int32_t bs = opts.block_size;
    const std::vector<int32_t> toks = worker.tokens(c.seq_id);
    uint64_t h = 0;
    const int32_t end = c.start_pos + static_cast<int32_t>(c.token_ids.size());
    for (int32_t p = 0; p < end; ++p) {
      h = mix(h, static_cast<uint64_t>(toks[static_cast<size_t>(p)]) + 1);
      const int32_t block = c.block_table[static_cast<size_t>(p / bs)];
      uint64_t& slot = kv[static_cast<size_t>(block) * bs + p % bs];
      if (p < c.start_pos) {
        ASSERT_EQ(slot, h) << "seq " << c.seq_id << " reads a wrong prefix at position " << p << " (block "
                           << block << ")";
      } else {
        slot = h;
      }
    }
  }

  void drain() {
    for (auto& ev : sched.take_events()) {
      auto& t = tokens[ev.request_id];
      EXPECT_EQ(finals[ev.request_id], 0) << "event after the final one for request " << ev.request_id;
      if (ev.finished()) {
        ++finals[ev.request_id];
      } else if (ev.kind == EventKind::kToken) {
        t.push_back(ev.token_id);
      } else if (ev.kind == EventKind::kPromptLogprobs) {
        auto& got = prompt_scores[ev.request_id];
        EXPECT_EQ(ev.prompt_start, static_cast<int32_t>(got.size()) + 1)
            << "request " << ev.request_id << ": prompt scores with a gap or a repeat";
        EXPECT_EQ(t.size(), tokens_at_submit[ev.request_id]) << "prompt scores after a generated token";
        for (size_t i = 0; i < ev.prompt_logprobs.size(); ++i) {
          const int32_t pos = ev.prompt_start + static_cast<int32_t>(i);
          EXPECT_EQ(ev.prompt_logprobs[i].logprob, prompt_logprob(pos));
          got.emplace_back(pos, ev.prompt_logprobs[i].id);
        }
      }
      events[ev.request_id].push_back(std::move(ev));
    }
  }

  // Steps until nothing is left (or max_steps); returns the steps taken. With
  // Keeps max_steps_in_flight steps in flight.
  int run_until_idle(int max_steps = 100000) {
    int n = 0;
    while (sched.has_unfinished() && n < max_steps) {
      while (sched.can_schedule()) {
        StepPlan plan = plan_and_run();
        if (plan.empty()) break;
        ++n;
      }
      if (results.empty()) {
        ADD_FAILURE() << "unfinished requests but an empty plan: stuck";
        break;
      }
      deliver();
    }
    while (!results.empty()) deliver();
    return n;
  }

  const RequestEvent* final_event(uint64_t id) const {
    auto it = events.find(id);
    if (it == events.end() || it->second.empty() || !it->second.back().finished()) return nullptr;
    return &it->second.back();
  }

  std::vector<int32_t> token_events(uint64_t id) const {
    std::vector<int32_t> v;
    auto it = events.find(id);
    if (it == events.end()) return v;
    for (const auto& ev : it->second)
      if (ev.kind == EventKind::kToken) v.push_back(ev.token_id);
    return v;
  }

 private:
  void check_plan(const StepPlan& plan, const std::set<uint64_t>& waiting_before, bool preempted) {
    const int32_t bs = opts.block_size;
    EXPECT_LE(plan.num_tokens(), opts.max_num_batched_tokens);
    EXPECT_LE(static_cast<int32_t>(plan.work.size()), opts.max_num_seqs);
    std::set<uint64_t> seen;
    // A step that preempted admits nothing, unless it would otherwise run
    // nothing (then even a sequence that just preempted itself may return).
    std::set<uint64_t> admitted;
    for (const auto& ns : plan.new_seqs) admitted.insert(ns.seq_id);
    const bool ran_running = std::any_of(plan.work.begin(), plan.work.end(),
                                         [&](const SeqWork& w) { return admitted.count(w.seq_id) == 0; });
    preempted = preempted && ran_running;
    for (const auto& w : plan.work) {
      EXPECT_TRUE(seen.insert(w.seq_id).second) << "seq " << w.seq_id << " twice in a plan";
      EXPECT_GE(w.num_tokens, 1);
      EXPECT_LE(w.new_blocks.size(), static_cast<size_t>((w.num_tokens + bs - 1) / bs + 1))
          << "a work item carries more new blocks than its tokens need";
      if (preempted) {
        EXPECT_EQ(waiting_before.count(w.seq_id), 0u)
            << "seq " << w.seq_id << " admitted in a preempting step";
      }
    }
    for (const auto& ns : plan.new_seqs) {
      EXPECT_EQ(seen.count(ns.seq_id), 1u) << "new seq " << ns.seq_id << " without work";
      EXPECT_EQ(ns.tokens, tokens.at(ns.seq_id)) << "new seq " << ns.seq_id << " is not its history";
    }
    if (preempted) ++steps_with_preemption;
  }
};

// 64 blocks of 4, 64 tokens per step, 8 sequences, no watermark.
inline SchedulerOptions small_options() {
  SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_num_batched_tokens = 64;
  o.max_num_seqs = 8;
  o.max_model_len = 128;
  o.watermark = 0.0;
  return o;
}

inline std::vector<int32_t> outputs(const Harness& h, uint64_t id) {
  const RequestEvent* f = h.final_event(id);
  return f ? f->output_ids : std::vector<int32_t>{};
}

inline std::vector<int32_t> scripted(const Harness& h, uint64_t id, int32_t prompt_len, int32_t n) {
  std::vector<int32_t> v;
  for (int32_t k = 0; k < n; ++k) v.push_back(h.script(id, prompt_len + k));
  return v;
}

}  // namespace troupe::core::test
