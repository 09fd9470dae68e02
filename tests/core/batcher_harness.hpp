#pragma once
// Scripted workers behind a core::Batcher (a SequenceTable each, no model):
// the cluster tests of the batcher drive this.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "core/batcher.hpp"
#include "core/sequence_table.hpp"
#include "scheduler_harness.hpp"

namespace troupe::core::test {

// The token a scripted worker samples for sequence `id` at position `pos`.
inline int32_t script(uint64_t id, int32_t pos) {
  return static_cast<int32_t>((id * 7919 + pos * 31) % 50000);
}

// What a scripted worker samples for a chunk that samples.
inline SeqOutput scripted_output(const SeqChunk& c) {
  return {c.seq_id, {script(c.seq_id, c.start_pos + static_cast<int32_t>(c.token_ids.size())), 0.f, {}, 0}};
}

inline SchedulerOptions worker_options(int32_t blocks = 64, int32_t in_flight = 2) {
  SchedulerOptions o = test::small_options();
  o.num_blocks = blocks;
  o.max_steps_in_flight = in_flight;
  return o;
}

// Scripted workers behind a Batcher: each runs its plans in order on its own
// SequenceTable and holds the results until delivered.
struct Cluster {
  explicit Cluster(BatcherOptions o = {}) : b(o) {}

  void add(uint64_t id, SchedulerOptions o = worker_options(),
           std::shared_ptr<StepCostModel> cost = nullptr) {
    ASSERT_FALSE(b.add_worker({id, "node" + std::to_string(id), "fake", o, std::move(cost)}));
    tables.emplace(id, SequenceTable(test::table_options(o)));
  }
  void lose(uint64_t id) {
    tables.erase(id);
    pending.erase(id);
    b.remove_worker(id, now);
    EXPECT_NO_THROW(b.check_invariants());
  }
  // One round: plan everything, run it on the workers, deliver one result per
  // worker (none from a frozen one: its results wait in `pending`).
  void round() {
    for (auto& d : b.schedule(now)) {
      auto& t = tables.at(d.worker);
      PreparedStep p = t.prepare(d.plan);
      for (const auto& f : p.failures) ADD_FAILURE() << "worker " << d.worker << " refused: " << f.error;
      StepResult r;
      r.step_id = d.plan.step_id;
      for (const auto& c : p.chunks) {
        if (!c.score_ids.empty()) {  // prompt logprobs: made up, -0.01 per position
          PromptScores& ps = r.prompt_scores.emplace_back();
          ps.seq_id = c.seq_id;
          ps.start = c.start_pos + 1;
          for (size_t i = 0; i < c.score_ids.size(); ++i)
            ps.tokens.push_back({c.score_ids[i], -0.01f * static_cast<float>(ps.start + static_cast<int32_t>(i)), {}, 1});
        }
        if (c.sample) r.outputs.push_back(scripted_output(c));
      }
      t.commit(p, r.outputs, {});
      pending[d.worker].push_back(r);
      ++plans[d.worker];
    }
    for (auto& [id, q] : pending) {
      if (q.empty() || frozen.count(id)) continue;
      EXPECT_FALSE(b.on_result(id, q.front(), now));
      q.pop_front();
    }
    now += tick;
    drain();
    EXPECT_NO_THROW(b.check_invariants());  // placement's board matches the workers
  }
  void drain() {
    for (auto& ev : b.take_events()) {
      if (ev.kind == EventKind::kToken) tokens[ev.request_id].push_back(ev.token_id);
      if (ev.kind == EventKind::kPromptLogprobs) {
        auto& got = prompt_scored[ev.request_id];
        EXPECT_EQ(ev.prompt_start, static_cast<int32_t>(got.size()) + 1) << "a gap or a repeat";
        EXPECT_TRUE(tokens[ev.request_id].empty()) << "prompt scores after a generated token";
        for (const auto& t : ev.prompt_logprobs) got.push_back(t.id);
      }
      if (ev.finished()) finals[ev.request_id].push_back(ev);
    }
  }
  void run(int max_rounds = 10000) {
    for (int i = 0; i < max_rounds && b.has_unfinished(); ++i) round();
    EXPECT_FALSE(b.has_unfinished());
  }
  std::vector<int32_t> expected(uint64_t id, int32_t prompt, int32_t n) const {
    std::vector<int32_t> v;
    for (int32_t k = 0; k < n; ++k) v.push_back(script(id, prompt + k));
    return v;
  }

  Batcher b;
  int64_t now = 0;
  int64_t tick = 1000;        // ns a round takes
  std::set<uint64_t> frozen;  // workers whose results are held back (hung)
  std::map<uint64_t, SequenceTable> tables;
  std::map<uint64_t, std::deque<StepResult>> pending;
  std::map<uint64_t, int> plans;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::vector<int32_t>> prompt_scored;  // the prompt token of each position 1.. scored
  std::map<uint64_t, std::vector<RequestEvent>> finals;
};

}  // namespace troupe::core::test
