#pragma once
// Drives a Scheduler with a scripted worker (no model): the token sampled at
// position p of sequence `id` is script(id, p), so a request's output is known
// in advance and survives preemption and recompute unchanged.
//
// The fake worker also keeps a shadow KV pool: every slot remembers a hash of
// the whole prefix whose K/V it holds. Before a chunk runs, every slot its
// block table maps for positions [0, start_pos) must hold exactly the prefix
// of that sequence; a chunk may only write slots of blocks it owns alone. So
// a wrong prefix-cache hit, an eviction of a live block or a lost token fails
// the test even though no real K/V exist.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/scheduler.hpp"

namespace troupe::actors::test {

inline uint64_t mix(uint64_t h, uint64_t v) {
  uint64_t x = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

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

// A chunk in short: (seq, start_pos, tokens, sample).
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
inline std::vector<ChunkView> view(const model::StepPlan& plan) {
  std::vector<ChunkView> v;
  for (const auto& c : plan.seqs) {
    v.push_back({c.seq_id, c.start_pos, static_cast<int32_t>(c.token_ids.size()), c.sample});
  }
  return v;
}

class Harness {
 public:
  using Script = std::function<int32_t(uint64_t id, int32_t pos)>;

  explicit Harness(const SchedulerOptions& o, const model::Tokenizer* tok = nullptr)
      : opts(o), sched(o, tok), kv(static_cast<size_t>(o.num_blocks) * o.block_size, 0) {}

  SchedulerOptions opts;
  Scheduler sched;
  // Never eos by default (ids < 50000).
  Script script = [](uint64_t id, int32_t pos) {
    return static_cast<int32_t>((id * 7919 + static_cast<uint64_t>(pos) * 31) % 50000);
  };
  std::map<uint64_t, std::vector<int32_t>> tokens;         // id -> prompt + outputs received
  std::map<uint64_t, std::vector<RequestEvent>> events;    // id -> its events
  std::map<uint64_t, int32_t> finals;                      // id -> final events seen
  std::vector<uint64_t> kv;                                // slot -> prefix hash (0 = never written)
  int64_t steps_with_preemption = 0;

  std::optional<std::string> submit(Request r) {
    const uint64_t id = r.id;
    auto prompt = r.prompt_ids;
    auto err = sched.submit(std::move(r));
    if (!err) {
      tokens[id] = prompt;  // a reused id starts a new history
      events[id].clear();
      finals[id] = 0;
    }
    sched.check_invariants();
    return err;
  }

  bool cancel(uint64_t id) {
    bool ok = sched.cancel(id);
    sched.check_invariants();
    drain();
    return ok;
  }

  // Plans, checks and runs one step on the fake worker; returns the plan.
  model::StepPlan step() {
    model::StepPlan plan = begin_step();
    if (!plan.seqs.empty()) end_step(plan);
    return plan;
  }

  // Plans and checks a step and lets the fake worker run it; the result is
  // handed back by end_step (submit and cancel may come in between).
  model::StepPlan begin_step() {
    std::set<uint64_t> waiting_before;
    for (const auto& [id, t] : tokens) {
      if (sched.is_waiting(id)) waiting_before.insert(id);
    }
    const int64_t preempted_before = sched.stats().preemptions;
    model::StepPlan plan = sched.schedule();
    sched.check_invariants();
    check_plan(plan, waiting_before, sched.stats().preemptions > preempted_before);
    execute(plan);
    return plan;
  }

  void end_step(const model::StepPlan& plan) {
    sched.on_step_done(result_for(plan));
    sched.check_invariants();
    drain();
  }

  // The worker's answer to a plan: one scripted token per sampling chunk.
  model::StepResult result_for(const model::StepPlan& plan) const {
    model::StepResult r;
    r.step_id = plan.step_id;
    for (const auto& c : plan.seqs) {
      if (!c.sample) continue;
      model::SeqOutput out;
      out.seq_id = c.seq_id;
      out.token.id = script(c.seq_id, c.start_pos + static_cast<int32_t>(c.token_ids.size()));
      r.outputs.push_back(out);
    }
    return r;
  }

  // Writes the plan's K/V into the shadow pool after checking what it reads.
  void execute(const model::StepPlan& plan) {
    const int32_t bs = opts.block_size;
    for (const auto& c : plan.seqs) {
      const auto& toks = tokens.at(c.seq_id);
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
  }

  void drain() {
    for (auto& ev : sched.take_events()) {
      auto& t = tokens[ev.request_id];
      EXPECT_EQ(finals[ev.request_id], 0) << "event after the final one for request " << ev.request_id;
      if (ev.finished) {
        ++finals[ev.request_id];
      } else {
        t.push_back(ev.token_id);
      }
      events[ev.request_id].push_back(std::move(ev));
    }
  }

  // Steps until nothing is left (or max_steps); returns the steps taken.
  int run_until_idle(int max_steps = 100000) {
    int n = 0;
    while (sched.has_unfinished() && n < max_steps) {
      auto plan = step();
      ++n;
      if (plan.seqs.empty()) {
        ADD_FAILURE() << "unfinished requests but an empty plan: stuck";
        break;
      }
    }
    return n;
  }

  const RequestEvent* final_event(uint64_t id) const {
    auto it = events.find(id);
    if (it == events.end() || it->second.empty() || !it->second.back().finished) return nullptr;
    return &it->second.back();
  }

 private:
  void check_plan(const model::StepPlan& plan, const std::set<uint64_t>& waiting_before, bool preempted) {
    const int32_t bs = opts.block_size;
    EXPECT_LE(plan.num_tokens(), opts.max_num_batched_tokens);
    EXPECT_LE(static_cast<int32_t>(plan.seqs.size()), opts.max_num_seqs);
    std::set<uint64_t> seen;
    std::set<int32_t> written_blocks;
    for (const auto& c : plan.seqs) {
      EXPECT_TRUE(seen.insert(c.seq_id).second) << "seq " << c.seq_id << " twice in a plan";
      ASSERT_FALSE(c.token_ids.empty());
      const auto& toks = tokens.at(c.seq_id);
      const int32_t end = c.start_pos + static_cast<int32_t>(c.token_ids.size());
      ASSERT_LE(end, static_cast<int32_t>(toks.size())) << "seq " << c.seq_id << " runs tokens it never had";
      EXPECT_EQ(c.sample, end == static_cast<int32_t>(toks.size())) << "seq " << c.seq_id;
      for (size_t k = 0; k < c.token_ids.size(); ++k) {
        ASSERT_EQ(c.token_ids[k], toks[static_cast<size_t>(c.start_pos) + k]) << "seq " << c.seq_id;
      }
      EXPECT_EQ(static_cast<int32_t>(c.block_table.size()), (end + bs - 1) / bs) << "seq " << c.seq_id;
      for (int32_t p = c.start_pos; p < end; ++p) {
        const int32_t b = c.block_table[static_cast<size_t>(p / bs)];
        EXPECT_EQ(sched.allocator().ref_count(b), 1) << "seq " << c.seq_id << " writes shared block " << b;
        EXPECT_FALSE(sched.allocator().is_cached(b)) << "seq " << c.seq_id << " writes cached block " << b;
        if (p == c.start_pos || p % bs == 0) {
          EXPECT_TRUE(written_blocks.insert(b).second) << "block " << b << " written by two chunks";
        }
      }
      if (preempted) {
        EXPECT_EQ(waiting_before.count(c.seq_id), 0u) << "seq " << c.seq_id << " admitted in a preempting step";
      }
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

}  // namespace troupe::actors::test
