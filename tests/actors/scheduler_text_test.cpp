// The scheduler's text stream with GPT-2's real tokenizer: incremental
// detokenisation and stop strings.
#include <gtest/gtest.h>

#include "actors/scheduler.hpp"
#include "model/tokenizer.hpp"
#include "scheduler_harness.hpp"
#include "test_utils.hpp"

namespace troupe::actors {
namespace {

using test::Harness;
using test::make_request;

const model::Tokenizer& gpt2() {
  static const model::Tokenizer tok = model::Tokenizer::from_dir(troupe::test::tokenizer_dir());
  return tok;
}

SchedulerOptions options() {
  SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_model_len = 128;
  return o;
}

// A harness whose request 1 generates exactly `text`'s tokens after its prompt.
struct TextRun {
  explicit TextRun(const std::string& text) : h(options(), &gpt2()), ids(gpt2().encode(text)) {
    h.script = [this](uint64_t, int32_t pos) {
      const auto k = static_cast<size_t>(pos - kPrompt);
      return k < ids.size() ? ids[k] : 50256;
    };
  }
  static constexpr int32_t kPrompt = 3;
  Harness h;
  std::vector<int32_t> ids;

  std::string streamed() const {
    std::string s;
    for (const auto& ev : h.events.at(1)) s += ev.text_delta;
    return s;
  }
};

TEST(SchedulerText, StreamsTheDecodedText) {
  const std::string text = " The quick brown fox jumps over the lazy dog. Caf\xc3\xa9 \xf0\x9f\x99\x82!";
  TextRun r(text);
  ASSERT_FALSE(r.h.submit(make_request(1, {464, 2068, 7586}, static_cast<int32_t>(r.ids.size()))));
  r.h.run_until_idle();
  const RequestEvent* f = r.h.final_event(1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, FinishReason::kLength);
  EXPECT_EQ(f->text, text);
  EXPECT_EQ(r.streamed(), text);
  EXPECT_EQ(f->output_ids, r.ids);
}

TEST(SchedulerText, StopStringEndsTheTextBeforeIt) {
  TextRun r(" The quick brown fox jumps over the lazy dog.");
  Request req = make_request(1, {464, 2068, 7586}, 40);
  req.stop = {"y d", "zebra"};  // spans the tokens " lazy" and " dog"
  ASSERT_FALSE(r.h.submit(req));
  r.h.run_until_idle();
  const RequestEvent* f = r.h.final_event(1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, FinishReason::kStop);
  EXPECT_STREQ(to_string(f->finish_reason), "stop");
  EXPECT_EQ(f->text, " The quick brown fox jumps over the laz");
  EXPECT_EQ(r.streamed(), f->text);
  // Generation stopped at the token that completed the stop string (" dog").
  ASSERT_FALSE(f->output_ids.empty());
  EXPECT_EQ(gpt2().decode({f->output_ids.back()}), " dog");
  EXPECT_EQ(f->usage.completion_tokens, static_cast<int32_t>(f->output_ids.size()));
}

TEST(SchedulerText, EosTextIsNotShown) {
  TextRun r(" Hello there");  // the script returns eos after the text
  ASSERT_FALSE(r.h.submit(make_request(1, {464, 2068, 7586}, 20)));
  r.h.run_until_idle();
  const RequestEvent* f = r.h.final_event(1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, FinishReason::kEos);
  EXPECT_EQ(f->text, " Hello there");
  EXPECT_EQ(f->output_ids.size(), r.ids.size() + 1);
}

TEST(SchedulerText, HeldBackTextComesWithTheFinalEvent) {
  TextRun r(" one two thr");
  Request req = make_request(1, {464, 2068, 7586}, static_cast<int32_t>(r.ids.size()));
  req.stop = {" three"};  // " thr" may start it: held back until the end
  ASSERT_FALSE(r.h.submit(req));
  r.h.run_until_idle();
  const RequestEvent* f = r.h.final_event(1);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->finish_reason, FinishReason::kLength);
  EXPECT_EQ(f->text_delta, " thr");
  EXPECT_EQ(f->text, " one two thr");
  EXPECT_EQ(r.streamed(), f->text);
}

TEST(SchedulerText, EmptyStopStringIsRejected) {
  Scheduler s(options(), &gpt2());
  Request req = make_request(1, {1, 2}, 2);
  req.stop = {""};
  EXPECT_TRUE(s.submit(req).has_value());
  EXPECT_EQ(s.num_waiting(), 0);
}

}  // namespace
}  // namespace troupe::actors
