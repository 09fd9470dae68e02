#include "core/scheduler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "scheduler_harness.hpp"

namespace troupe::core {
namespace {

using test::ChunkView;
using test::Harness;
using test::make_request;
using test::outputs;
using test::range_tokens;
using test::scripted;
using test::small_options;
using test::view;

TEST(Scheduler, OneRequestPrefillsThenDecodesToLength) {
  Harness h(small_options());
  ASSERT_FALSE(h.submit(make_request(1, {1, 2, 3, 4, 5}, 4)));
  EXPECT_EQ(h.sched.num_waiting(), 1);

  auto p1 = h.step();
  EXPECT_EQ(view(p1), (std::vector<ChunkView>{{1, 0, 5, true}}));
  ASSERT_EQ(p1.new_seqs.size(), 1u);
  EXPECT_EQ(p1.new_seqs[0].tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(p1.new_seqs[0].block_table.size(), 2u);
  EXPECT_EQ(h.last.chunks[0].block_table.size(), 2u);
  for (int32_t pos = 5; pos < 8; ++pos) {
    auto p = h.step();
    ASSERT_EQ(view(p), (std::vector<ChunkView>{{1, pos, 1, true}}));
    EXPECT_TRUE(p.new_seqs.empty()) << "a running sequence is sent once";
    EXPECT_TRUE(p.work[0].new_blocks.empty());
    EXPECT_EQ(h.last.chunks[0].token_ids[0], h.script(1, pos));  // the worker fed its own sample
    EXPECT_EQ(h.last.chunks[0].block_table.size(), 2u);
  }
  const RequestEvent* f = h.final_event(1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, FinishReason::kLength);
  EXPECT_STREQ(to_string(f->finish_reason), "length");
  EXPECT_EQ(f->output_ids, scripted(h, 1, 5, 4));
  EXPECT_EQ(f->usage.prompt_tokens, 5);
  EXPECT_EQ(f->usage.completion_tokens, 4);
  EXPECT_EQ(f->usage.cached_tokens, 0);
  EXPECT_EQ(h.events[1].size(), 6u);  // scheduled, four tokens, final

  EXPECT_FALSE(h.sched.has_unfinished());
  EXPECT_TRUE(h.sched.schedule().empty());
  EXPECT_FALSE(h.sched.step_in_flight());
  auto st = h.sched.stats();
  EXPECT_EQ(st.blocks_used, 0);
  EXPECT_EQ(st.blocks_free, 64);
  EXPECT_EQ(st.blocks_cached, 2);  // 8 computed tokens: two full blocks kept for reuse
  EXPECT_EQ(st.tokens_scheduled, 8);
  EXPECT_EQ(st.tokens_generated, 4);
  EXPECT_EQ(st.steps, 4);
}

TEST(Scheduler, EverySequenceCarriesASeed) {
  auto seeds = [](uint64_t base) {
    SchedulerOptions o = small_options();
    o.seed = base;
    Scheduler s(o);
    Request a = make_request(1, {1, 2}, 2), b = make_request(2, {1, 2}, 2), c = make_request(3, {1, 2}, 2);
    c.seed = 42;
    EXPECT_FALSE(s.submit(a));
    EXPECT_FALSE(s.submit(b));
    EXPECT_FALSE(s.submit(c));
    auto plan = s.schedule();
    std::vector<uint64_t> v;
    for (const auto& ns : plan.new_seqs) v.push_back(ns.sampling.seed);
    return v;
  };
  auto a = seeds(7), b = seeds(7), c = seeds(8);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a[0], a[1]);
  EXPECT_EQ(a[2], 42u);
  EXPECT_NE(a[0], c[0]);
}

TEST(Scheduler, RequestsJoinAndLeaveBetweenSteps) {
  SchedulerOptions o = small_options();
  o.max_num_batched_tokens = 6;
  o.max_num_seqs = 3;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(4), 3)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(4, 10), 5)));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 0, 4, true}, {2, 0, 2, false}}));
  ASSERT_FALSE(h.submit(make_request(3, range_tokens(3, 20), 2)));
  ASSERT_FALSE(h.submit(make_request(4, range_tokens(3, 30), 2)));
  // Decode first, then the rest of 2's prompt, then 3 is admitted; 4 waits (max_num_seqs).
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 4, 1, true}, {2, 2, 2, true}, {3, 0, 3, true}}));
  EXPECT_EQ(h.sched.num_waiting(), 1);
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 5, 1, true}, {2, 4, 1, true}, {3, 3, 1, true}}));
  // 1 and 3 are done; 4 takes a slot at once.
  ASSERT_NE(h.final_event(1), nullptr);
  ASSERT_NE(h.final_event(3), nullptr);
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{2, 5, 1, true}, {4, 0, 3, true}}));
  h.run_until_idle();
  for (uint64_t id : {1, 2, 3, 4}) {
    ASSERT_NE(h.final_event(id), nullptr);
    EXPECT_EQ(h.final_event(id)->finish_reason, FinishReason::kLength);
  }
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 4, 5));
}

TEST(Scheduler, LongPromptIsChunkedAndSamplesOnlyAtTheEnd) {
  SchedulerOptions o = small_options();
  o.max_num_batched_tokens = 16;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(50), 2)));
  const std::vector<ChunkView> want = {
      {1, 0, 16, false}, {1, 16, 16, false}, {1, 32, 16, false}, {1, 48, 2, true}, {1, 50, 1, true}};
  const std::vector<size_t> tables = {4, 8, 12, 13, 13};
  for (size_t i = 0; i < want.size(); ++i) {
    auto p = h.step();
    ASSERT_EQ(view(p), (std::vector<ChunkView>{want[i]})) << "step " << i;
    EXPECT_EQ(h.last.chunks[0].block_table.size(), tables[i]) << "step " << i;
    if (i + 1 < want.size()) {
      EXPECT_LE(static_cast<int64_t>(h.last.chunks[0].block_table.size()) * 4 - (want[i].start + want[i].n),
                3);
    }
  }
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 50, 2));
}

TEST(Scheduler, DecodesGoBeforePromptChunks) {
  SchedulerOptions o = small_options();
  o.max_num_batched_tokens = 16;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(4), 10)));
  h.step();
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(40, 100), 2)));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 4, 1, true}, {2, 0, 15, false}}));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 5, 1, true}, {2, 15, 15, false}}));
  auto st = h.sched.stats();
  EXPECT_EQ(st.num_running, 2);
  EXPECT_EQ(st.tokens_held, 6 + 30);  // 1's newest token is not fed back yet
  EXPECT_EQ(st.slots_allocated, 2 * 4 + 8 * 4);
  EXPECT_NEAR(st.kv_utilization, 36.0 / 40.0, 1e-9);
}

TEST(Scheduler, PriorityThenArrivalDecidesAdmission) {
  SchedulerOptions o = small_options();
  o.max_num_seqs = 1;
  Harness h(o);
  Request a = make_request(1, {1}, 1), b = make_request(2, {2}, 1), c = make_request(3, {3}, 1);
  a.priority = 5;
  ASSERT_FALSE(h.submit(a));
  ASSERT_FALSE(h.submit(b));
  ASSERT_FALSE(h.submit(c));
  std::vector<uint64_t> order;
  for (int i = 0; i < 3; ++i) order.push_back(h.step().work.at(0).seq_id);
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 3, 1}));
}

TEST(Scheduler, WithoutChunkingAPromptRunsWhole) {
  SchedulerOptions o = small_options();
  o.enable_chunked_prefill = false;
  o.max_num_batched_tokens = 16;
  Harness h(o);
  EXPECT_TRUE(h.submit(make_request(9, range_tokens(14), 4)));  // 17 tokens might need one step
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(10), 3)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(10, 50), 3)));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 0, 10, true}}));
  EXPECT_EQ(view(h.step()), (std::vector<ChunkView>{{1, 10, 1, true}, {2, 0, 10, true}}));
  h.run_until_idle();
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 10, 3));
}

TEST(Scheduler, CancelInEveryState) {
  SchedulerOptions o = small_options();
  o.max_num_batched_tokens = 4;
  o.max_num_seqs = 2;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(2), 10)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(12, 50), 10)));
  ASSERT_FALSE(h.submit(make_request(3, range_tokens(3, 90), 10)));
  h.step();  // 1 whole, 2's first 2 tokens; 3 waits (max_num_seqs)
  h.step();  // 1 decodes, 2 mid-prefill
  EXPECT_TRUE(h.sched.is_waiting(3));

  EXPECT_TRUE(h.cancel(3));  // waiting
  EXPECT_TRUE(h.cancel(2));  // mid-prefill
  const int32_t used_by_1 = h.sched.stats().blocks_used;
  EXPECT_EQ(used_by_1, 1);
  EXPECT_TRUE(h.cancel(1));  // running
  for (uint64_t id : {1, 2, 3}) {
    const RequestEvent* f = h.final_event(id);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->finish_reason, FinishReason::kCancelled);
    EXPECT_EQ(h.finals[id], 1);
  }
  EXPECT_EQ(h.final_event(1)->usage.completion_tokens, 2);
  EXPECT_EQ(h.final_event(3)->usage.completion_tokens, 0);
  EXPECT_FALSE(h.cancel(1));
  EXPECT_FALSE(h.cancel(77));
  EXPECT_EQ(h.sched.stats().blocks_used, 0);
  EXPECT_FALSE(h.sched.has_unfinished());
}

TEST(Scheduler, ResultForACancelledSequenceIsIgnored) {
  Harness h(small_options());
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(5), 5)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(5, 20), 5)));
  h.plan_and_run();
  h.drain();
  EXPECT_TRUE(h.cancel(1));
  // Same id again while the old step is still in flight.
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(3, 70), 2)));
  h.deliver();
  EXPECT_EQ(h.events[1].size(), 0u);  // the new request 1 got nothing from the old step
  EXPECT_TRUE(h.sched.is_waiting(1));
  EXPECT_EQ(h.token_events(2).size(), 1u);
  h.run_until_idle();
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 3, 2));
  EXPECT_EQ(outputs(h, 2), scripted(h, 2, 5, 5));
}

TEST(Scheduler, RejectedSubmissionsChangeNothing) {
  SchedulerOptions o = small_options();
  o.num_blocks = 4;  // 16 slots
  o.max_model_len = 20;
  Harness h(o);
  ASSERT_FALSE(h.submit(make_request(1, {1, 2}, 2)));
  auto before = h.sched.stats();
  auto good = make_request(2, {1, 2, 3}, 3);
  std::vector<std::pair<std::string, Request>> bad;
  auto add = [&](const std::string& name, auto mutate) {
    Request r = good;
    mutate(r);
    bad.emplace_back(name, r);
  };
  add("duplicate id", [](Request& r) { r.id = 1; });
  add("empty prompt", [](Request& r) { r.prompt_ids.clear(); });
  add("prompt too long", [](Request& r) { r.prompt_ids = range_tokens(21); });
  add("prompt + max_tokens too long", [](Request& r) { r.max_tokens = 18; });
  add("max_tokens 0", [](Request& r) { r.max_tokens = 0; });
  add("max_tokens negative", [](Request& r) { r.max_tokens = -3; });
  add("token id -1", [](Request& r) { r.prompt_ids[1] = -1; });
  add("token id = vocab", [](Request& r) { r.prompt_ids[2] = 50257; });
  add("temperature < 0", [](Request& r) { r.sampling.temperature = -0.5f; });
  add("temperature NaN", [](Request& r) { r.sampling.temperature = std::nanf(""); });
  add("temperature inf", [](Request& r) { r.sampling.temperature = std::numeric_limits<float>::infinity(); });
  add("top_k < 0", [](Request& r) { r.sampling.top_k = -1; });
  add("top_p 0", [](Request& r) { r.sampling.top_p = 0.0f; });
  add("top_p > 1", [](Request& r) { r.sampling.top_p = 1.5f; });
  add("logprobs 21", [](Request& r) { r.sampling.logprobs = 21; });
  add("logprobs -2", [](Request& r) { r.sampling.logprobs = -2; });
  add("output as long as max_tokens", [](Request& r) { r.output_ids = {4, 5, 6}; });
  add("output token outside the vocabulary", [](Request& r) { r.output_ids = {50257}; });
  add("output ending with eos", [](Request& r) { r.output_ids = {9, 50256}; });
  add("never fits the pool", [](Request& r) {  // 10 + 8 - 1 = 17 slots > 16
    r.prompt_ids = range_tokens(10);
    r.max_tokens = 8;
  });
  for (auto& [name, r] : bad) {
    auto err = h.submit(r);
    ASSERT_TRUE(err.has_value()) << name;
    EXPECT_FALSE(err->empty()) << name;
    auto after = h.sched.stats();
    EXPECT_EQ(after.num_waiting, before.num_waiting) << name;
    EXPECT_EQ(after.num_running, before.num_running) << name;
    EXPECT_EQ(after.blocks_used, before.blocks_used) << name;
    EXPECT_TRUE(h.sched.take_events().empty()) << name;
  }
  // Limits exactly at the edge are fine, and the rejected id 2 is still free.
  auto edge = make_request(2, range_tokens(9), 8);  // 16 slots, 17 tokens <= max_model_len
  EXPECT_FALSE(h.submit(edge));
  EXPECT_EQ(h.sched.num_waiting(), 2);
}

TEST(Scheduler, FinishesOnEosUnlessIgnored) {
  Harness h(small_options());
  h.script = [](uint64_t id, int32_t pos) { return pos == 6 ? 50256 : static_cast<int32_t>(id + pos); };
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(4), 10)));
  Request r = make_request(2, range_tokens(4), 5);
  r.ignore_eos = true;
  ASSERT_FALSE(h.submit(r));
  h.run_until_idle();
  const RequestEvent* f1 = h.final_event(1);
  ASSERT_NE(f1, nullptr);
  EXPECT_EQ(f1->finish_reason, FinishReason::kEos);
  EXPECT_EQ(f1->output_ids, (std::vector<int32_t>{5, 6, 50256}));
  EXPECT_EQ(f1->usage.completion_tokens, 3);
  const RequestEvent* f2 = h.final_event(2);
  EXPECT_EQ(f2->finish_reason, FinishReason::kLength);
  EXPECT_EQ(f2->output_ids.size(), 5u);
  EXPECT_EQ(f2->output_ids[2], 50256);
}

TEST(Scheduler, StepResultMustMatchThePlan) {
  Harness h(small_options());
  ASSERT_FALSE(h.submit(make_request(1, range_tokens(3), 3)));
  ASSERT_FALSE(h.submit(make_request(2, range_tokens(3, 9), 3)));
  h.plan_and_run();
  EXPECT_THROW(h.sched.schedule(), std::logic_error);
  auto good = h.results.front();
  h.results.clear();
  auto wrong_step = good;
  wrong_step.step_id += 1;
  auto missing = good;
  missing.outputs.pop_back();
  auto swapped = good;
  std::swap(swapped.outputs[0], swapped.outputs[1]);
  auto bad_token = good;
  bad_token.outputs[0].token.id = 50257;
  auto extra = good;
  extra.outputs.push_back(good.outputs[0]);
  auto stranger = good;
  stranger.failures.push_back({99, "no such seq", true});
  auto error_and_outputs = good;
  error_and_outputs.error = "boom";
  h.drain();
  for (const auto* r : {&wrong_step, &missing, &swapped, &bad_token, &extra, &stranger, &error_and_outputs}) {
    EXPECT_THROW(h.sched.on_step_done(*r), std::invalid_argument);
    h.sched.check_invariants();
    EXPECT_TRUE(h.sched.take_events().empty());
  }
  h.sched.on_step_done(good);
  EXPECT_THROW(h.sched.on_step_done(good), std::invalid_argument);
  h.drain();
  h.run_until_idle();
  EXPECT_EQ(outputs(h, 1), scripted(h, 1, 3, 3));
}

TEST(Scheduler, RejectsImpossibleOptions) {
  auto with = [](auto mutate) {
    SchedulerOptions o = small_options();
    mutate(o);
    return o;
  };
  EXPECT_THROW(Scheduler(with([](SchedulerOptions& o) { o.num_blocks = 0; })), std::invalid_argument);
  EXPECT_THROW(Scheduler(with([](SchedulerOptions& o) { o.block_size = 0; })), std::invalid_argument);
  EXPECT_THROW(Scheduler(with([](SchedulerOptions& o) { o.max_num_batched_tokens = 0; })),
               std::invalid_argument);
  EXPECT_THROW(Scheduler(with([](SchedulerOptions& o) { o.max_num_seqs = 0; })), std::invalid_argument);
  EXPECT_THROW(Scheduler(with([](SchedulerOptions& o) { o.watermark = 1.0; })), std::invalid_argument);
  EXPECT_THROW(Scheduler(with([](SchedulerOptions& o) { o.eos_id = 50257; })), std::invalid_argument);
  EXPECT_THROW(Scheduler(with([](SchedulerOptions& o) { o.max_steps_in_flight = 0; })),
               std::invalid_argument);
}

}  // namespace
}  // namespace troupe::core
