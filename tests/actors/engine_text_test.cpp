// The engine's text stream with GPT-2's real tokenizer: incremental
// detokenisation and stop strings, over a scripted worker (no model).
#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "core/sequence_table.hpp"
#include "model/text/tokenizer.hpp"
#include "test_utils.hpp"

namespace troupe::actors {
namespace {

const model::Tokenizer& gpt2() {
  static const model::Tokenizer tok = model::Tokenizer::from_dir(troupe::test::tokenizer_dir());
  return tok;
}

core::SchedulerOptions options() {
  core::SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_model_len = 128;
  return o;
}

constexpr int32_t kPrompt = 3;

// An engine whose worker generates exactly `text`'s tokens after the prompt,
// then eos: a SequenceTable keeps the worker's state, the script samples.
struct TextRun {
  explicit TextRun(const std::string& text)
      : ids(gpt2().encode(text)),
        table(core::SequenceTableOptions{64, 4, 128, 50257}),
        engine(options(), &gpt2(), [this](const core::StepPlan& plan) { return run(plan); }) {}

  core::StepResult run(const core::StepPlan& plan) {
    core::PreparedStep step = table.prepare(plan);
    core::StepResult r;
    r.step_id = plan.step_id;
    for (const auto& c : step.chunks) {
      if (!c.sample) continue;
      const auto k = static_cast<size_t>(c.start_pos + static_cast<int32_t>(c.token_ids.size()) - kPrompt);
      r.outputs.push_back({c.seq_id, core::SampledToken{k < ids.size() ? ids[k] : 50256, 0.0f, {}, 0}});
    }
    table.commit(step, r.outputs, {});
    return r;
  }

  void run_all() {
    engine.run_until_idle();
    for (auto& ev : engine.take_events()) events.push_back(std::move(ev));
  }
  const core::RequestEvent* final_event() const {
    return !events.empty() && events.back().finished() ? &events.back() : nullptr;
  }
  std::string streamed() const {
    std::string s;
    for (const auto& ev : events) s += ev.text_delta;
    return s;
  }

  std::vector<int32_t> ids;
  core::SequenceTable table;
  Engine engine;
  std::vector<core::RequestEvent> events;
};

core::Request request(int32_t max_tokens) {
  core::Request r;
  r.id = 1;
  r.prompt_ids = {464, 2068, 7586};
  r.max_tokens = max_tokens;
  return r;
}

TEST(EngineText, StreamsTheDecodedText) {
  const std::string text = " The quick brown fox jumps over the lazy dog. Caf\xc3\xa9 \xf0\x9f\x99\x82!";
  TextRun r(text);
  ASSERT_FALSE(r.engine.submit(request(static_cast<int32_t>(r.ids.size()))));
  r.run_all();
  const core::RequestEvent* f = r.final_event();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, core::FinishReason::kLength);
  EXPECT_EQ(f->text, text);
  EXPECT_EQ(r.streamed(), text);
  EXPECT_EQ(f->output_ids, r.ids);
}

TEST(EngineText, StopStringEndsTheTextBeforeIt) {
  TextRun r(" The quick brown fox jumps over the lazy dog.");
  ASSERT_FALSE(r.engine.submit(request(40), {"y d", "zebra"}));  // spans the tokens " lazy" and " dog"
  r.run_all();
  const core::RequestEvent* f = r.final_event();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, core::FinishReason::kStop);
  EXPECT_STREQ(core::to_string(f->finish_reason), "stop");
  EXPECT_EQ(f->text, " The quick brown fox jumps over the laz");
  EXPECT_EQ(r.streamed(), f->text);
  // Generation stopped at the token that completed the stop string (" dog").
  ASSERT_FALSE(f->output_ids.empty());
  EXPECT_EQ(gpt2().decode({f->output_ids.back()}), " dog");
  EXPECT_EQ(f->usage.completion_tokens, static_cast<int32_t>(f->output_ids.size()));
}

TEST(EngineText, EosTextIsNotShown) {
  TextRun r(" Hello there");  // the script returns eos after the text
  ASSERT_FALSE(r.engine.submit(request(20)));
  r.run_all();
  const core::RequestEvent* f = r.final_event();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, core::FinishReason::kEos);
  EXPECT_EQ(f->text, " Hello there");
  EXPECT_EQ(f->output_ids.size(), r.ids.size() + 1);
}

TEST(EngineText, HeldBackTextComesWithTheFinalEvent) {
  TextRun r(" one two thr");
  ASSERT_FALSE(
      r.engine.submit(request(static_cast<int32_t>(r.ids.size())), {" three"}));  // " thr" may start it
  r.run_all();
  const core::RequestEvent* f = r.final_event();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, core::FinishReason::kLength);
  EXPECT_EQ(f->text_delta, " thr");
  EXPECT_EQ(f->text, " one two thr");
  EXPECT_EQ(r.streamed(), f->text);
}

TEST(EngineText, BadStopStringsAreRejected) {
  TextRun r(" x");
  auto err = r.engine.submit(request(2), {""});
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("non-empty"), std::string::npos) << *err;
  Engine no_text(options(), nullptr, [](const core::StepPlan& p) {
    return core::StepResult{p.step_id, {}, {}, {}, {}};
  });
  err = no_text.submit(request(2), {"x"});
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->find("tokenizer"), std::string::npos) << *err;
  EXPECT_FALSE(no_text.has_unfinished());
}

}  // namespace
}  // namespace troupe::actors
