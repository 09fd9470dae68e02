// RouterCore with GPT-2's real tokenizer: validation and rejection codes,
// ids and seeds, the queue bound, streaming text with stop strings, cancel and
// vanished clients, timings.
#include "actors/router/router_core.hpp"

#include <gtest/gtest.h>

#include <map>

#include "model/text/tokenizer.hpp"
#include "test_utils.hpp"

namespace troupe::actors {
namespace {

ClientId zmq(const char* routing_id) { return ClientId::zmq(routing_id); }

const model::Tokenizer& gpt2() {
  static const model::Tokenizer tok = model::Tokenizer::from_dir(troupe::test::tokenizer_dir());
  return tok;
}

RouterOptions options(int32_t max_queue = 8) {
  RouterOptions o;
  o.max_queue = max_queue;
  o.max_model_len = 64;
  o.seed = 5;
  return o;
}

Job text_job(uint64_t tag, const std::string& prompt, int32_t max_tokens = 8) {
  Job j;
  j.tag = tag;
  j.prompt = prompt;
  j.max_tokens = max_tokens;
  return j;
}

template <class T>
std::vector<T> of(const RouterOutput& out) {
  std::vector<T> v;
  for (const auto& r : out.replies)
    if (auto* m = std::get_if<T>(&r.message)) v.push_back(*m);
  return v;
}

core::RequestEvent token(uint64_t id, int32_t t) {
  core::RequestEvent ev;
  ev.request_id = id;
  ev.kind = core::EventKind::kToken;
  ev.token_id = t;
  return ev;
}

core::RequestEvent scheduled(uint64_t id, int32_t cached = 0) {
  core::RequestEvent ev;
  ev.request_id = id;
  ev.kind = core::EventKind::kScheduled;
  ev.usage.cached_tokens = cached;
  return ev;
}

core::RequestEvent finished(uint64_t id, core::FinishReason reason) {
  core::RequestEvent ev;
  ev.request_id = id;
  ev.kind = core::EventKind::kFinished;
  ev.finish_reason = reason;
  return ev;
}

TEST(RouterCore, AcceptsTokenizesAndAssignsIdsAndSeeds) {
  RouterCore r(gpt2(), options());
  RouterOutput out;
  r.on_submit(zmq("a"), text_job(1, "Hello world"), 0, out);
  Job ids = text_job(2, "");
  ids.prompt.reset();
  ids.prompt_ids = std::vector<int32_t>{15496, 995};
  ids.seed = 77;
  ids.priority = -1;
  r.on_submit(zmq("b"), ids, 0, out);
  ASSERT_EQ(of<Accepted>(out).size(), 2u);
  ASSERT_EQ(out.commands.size(), 2u);
  const auto& r1 = std::get<core::Request>(out.commands[0]);
  const auto& r2 = std::get<core::Request>(out.commands[1]);
  EXPECT_EQ(r1.prompt_ids, gpt2().encode("Hello world"));
  EXPECT_EQ(r2.prompt_ids, (std::vector<int32_t>{15496, 995}));
  EXPECT_NE(r1.id, r2.id);
  EXPECT_EQ(of<Accepted>(out)[0].request_id, r1.id);
  ASSERT_TRUE(r1.seed.has_value());
  EXPECT_EQ(*r2.seed, 77u);
  EXPECT_EQ(r2.priority, -1);
  // Seeds come from the router's seeded counter: the same for the same order.
  RouterCore again(gpt2(), options());
  RouterOutput out2;
  again.on_submit(zmq("z"), text_job(9, "Other text"), 0, out2);
  EXPECT_EQ(*std::get<core::Request>(out2.commands[0]).seed, *r1.seed);
  EXPECT_EQ(r.stats().queued, 2);
}

TEST(RouterCore, RejectsBadJobsWithTheRightCode) {
  RouterCore r(gpt2(), options());
  auto code_of = [&](Job j) {
    RouterOutput out;
    r.on_submit(zmq("c"), j, 0, out);
    auto rej = of<Rejected>(out);
    EXPECT_TRUE(out.commands.empty());
    return rej.empty() ? std::string("accepted")
                       : std::string(to_string(rej[0].code)) + ": " + rej[0].message;
  };
  auto expect = [&](Job j, const std::string& code, const std::string& words) {
    const std::string got = code_of(std::move(j));
    EXPECT_EQ(got.rfind(code, 0), 0u) << got;
    EXPECT_NE(got.find(words), std::string::npos) << got;
  };
  Job both = text_job(1, "x");
  both.prompt_ids = std::vector<int32_t>{1};
  expect(both, "invalid", "exactly one");
  Job none = text_job(1, "x");
  none.prompt.reset();
  expect(none, "invalid", "exactly one");
  expect(text_job(1, ""), "invalid", "empty");
  expect(text_job(1, std::string("\xff\xfe bad utf-8")), "invalid", "prompt");
  expect(text_job(1, "x", 0), "invalid", "max_tokens");
  expect(text_job(1, std::string(400, 'a') +
                         " b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k "
                         "l m n o p q r s t u v w x y z"),
         "too_long", "tokens");
  expect(text_job(1, "Hello", 64), "too_long", "max_tokens");
  Job hot = text_job(1, "x");
  hot.temperature = -1;
  expect(hot, "invalid", "temperature");
  Job stops = text_job(1, "x");
  stops.stop = {""};
  expect(stops, "invalid", "non-empty");
  stops.stop = std::vector<std::string>(kMaxStops + 1, "s");
  expect(stops, "invalid", "stop strings");
  Job vocab = text_job(1, "x");
  vocab.prompt.reset();
  vocab.prompt_ids = std::vector<int32_t>{1, 50257};
  expect(vocab, "invalid", "vocabulary");
  EXPECT_EQ(r.stats().accepted, 0);
  EXPECT_EQ(r.stats().rejected, 11);
  // A running tag cannot be reused by the same client; another client may.
  RouterOutput out;
  r.on_submit(zmq("c"), text_job(3, "ok"), 0, out);
  expect(text_job(3, "again"), "invalid", "tag 3");
  r.on_submit(zmq("d"), text_job(3, "ok"), 0, out);
  EXPECT_EQ(of<Accepted>(out).size(), 2u);
}

TEST(RouterCore, PastMaxQueueJobsAreBusyAtOnceUntilRequestsStart) {
  RouterCore r(gpt2(), options(/*max_queue=*/2));
  RouterOutput out;
  for (uint64_t t = 1; t <= 3; ++t) r.on_submit(zmq("a"), text_job(t, "x"), 0, out);
  ASSERT_EQ(of<Rejected>(out).size(), 1u);
  EXPECT_EQ(of<Rejected>(out)[0].code, RejectCode::kBusy);
  EXPECT_EQ(of<Rejected>(out)[0].tag, 3u);
  EXPECT_EQ(out.commands.size(), 2u);
  const uint64_t first = of<Accepted>(out)[0].request_id;
  RouterOutput out2;
  r.on_events({scheduled(first)}, 10, out2);  // one starts running: room for one more
  r.on_submit(zmq("a"), text_job(4, "x"), 10, out2);
  EXPECT_EQ(of<Accepted>(out2).size(), 1u);
  r.on_submit(zmq("a"), text_job(5, "x"), 10, out2);
  EXPECT_EQ(of<Rejected>(out2).size(), 1u);
  EXPECT_EQ(r.stats().queued, 2);
  EXPECT_EQ(r.stats().running, 1);
}

TEST(RouterCore, StreamsTextAndFinishesWithUsageAndTimings) {
  RouterCore r(gpt2(), options());
  RouterOutput out;
  Job j = text_job(7, "Once upon");
  j.logprobs = 1;
  r.on_submit(zmq("a"), j, 1'000'000, out);
  const uint64_t id = of<Accepted>(out)[0].request_id;
  const auto ids = gpt2().encode(" a time, caf\xc3\xa9");
  RouterOutput s;
  r.on_events({scheduled(id, 0)}, 3'000'000, s);
  int64_t t = 5'000'000;
  for (int32_t x : ids) r.on_events({token(id, x)}, t += 1'000'000, s);
  r.on_events({token(id, 50256), finished(id, core::FinishReason::kEos)}, t += 1'000'000, s);
  std::string text;
  size_t n_ids = 0, n_lp = 0;
  for (const auto& d : of<Tokens>(s)) {
    text += d.text;
    n_ids += d.ids.size();
    n_lp += d.logprobs.size();
    EXPECT_EQ(d.tag, 7u);
  }
  auto fin = of<Finished>(s);
  ASSERT_EQ(fin.size(), 1u);
  text += fin[0].text;
  EXPECT_EQ(text, " a time, caf\xc3\xa9");
  EXPECT_EQ(n_ids, ids.size() + 1);
  EXPECT_EQ(n_lp, n_ids);
  EXPECT_EQ(fin[0].finish_reason, core::FinishReason::kEos);
  EXPECT_EQ(fin[0].usage.prompt_tokens, static_cast<int32_t>(gpt2().encode("Once upon").size()));
  EXPECT_EQ(fin[0].usage.completion_tokens, static_cast<int32_t>(ids.size()) + 1);
  EXPECT_DOUBLE_EQ(fin[0].timings.queue_ms, 2.0);
  EXPECT_DOUBLE_EQ(fin[0].timings.ttft_ms, 5.0);
  EXPECT_DOUBLE_EQ(fin[0].timings.e2e_ms, static_cast<double>(t - 1'000'000) / 1e6);
  EXPECT_TRUE(r.idle());
  EXPECT_EQ(r.stats().finished, 1);
  EXPECT_EQ(r.stats().running, 0);
}

TEST(RouterCore, AStopStringEndsTheRequestHereAndAtTheBatcher) {
  RouterCore r(gpt2(), options());
  RouterOutput out;
  Job j = text_job(1, "Count:");
  j.stop = {" three"};
  r.on_submit(zmq("a"), j, 0, out);
  const uint64_t id = of<Accepted>(out)[0].request_id;
  RouterOutput s;
  for (int32_t x : gpt2().encode(" one two three four")) r.on_events({token(id, x)}, 1, s);
  auto fin = of<Finished>(s);
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(fin[0].finish_reason, core::FinishReason::kStop);
  std::string text;
  for (const auto& d : of<Tokens>(s)) text += d.text;
  EXPECT_EQ(text + fin[0].text, " one two");
  ASSERT_EQ(s.commands.size(), 1u);
  const auto& cmd = std::get<FinishCommand>(s.commands[0]);
  EXPECT_EQ(cmd.request_id, id);
  EXPECT_EQ(cmd.reason, core::FinishReason::kStop);
  EXPECT_EQ(of<Tokens>(s).size(), 3u) << "tokens after the stop are not streamed";
  // The batcher's own final event for it comes later and is ignored.
  RouterOutput late;
  r.on_events({finished(id, core::FinishReason::kStop)}, 2, late);
  EXPECT_TRUE(late.replies.empty());
}

TEST(RouterCore, CancelAndVanishedClientsEndTheirRequestsOnce) {
  RouterCore r(gpt2(), options());
  RouterOutput out;
  r.on_submit(zmq("a"), text_job(1, "x"), 0, out);
  r.on_submit(zmq("a"), text_job(2, "y"), 0, out);
  r.on_submit(zmq("b"), text_job(1, "z"), 0, out);
  const auto acc = of<Accepted>(out);
  RouterOutput c;
  EXPECT_TRUE(r.on_cancel(zmq("b"), 1, 5, c));
  EXPECT_FALSE(r.on_cancel(zmq("b"), 1, 5, c));
  ASSERT_EQ(of<Finished>(c).size(), 1u);
  EXPECT_EQ(of<Finished>(c)[0].finish_reason, core::FinishReason::kCancelled);
  ASSERT_EQ(c.commands.size(), 1u);
  EXPECT_EQ(std::get<FinishCommand>(c.commands[0]).request_id, acc[2].request_id);
  RouterOutput g;
  r.on_client_gone(zmq("a"), g);
  EXPECT_TRUE(g.replies.empty()) << "nothing is sent to a client that is gone";
  EXPECT_EQ(g.commands.size(), 2u);
  EXPECT_TRUE(r.idle());
  RouterOutput late;
  r.on_events({token(acc[0].request_id, 5)}, 9, late);
  EXPECT_TRUE(late.replies.empty());
}

TEST(RouterCore, AbortAllEndsEveryOpenJobWithTheErrorAndItsTextSoFar) {
  RouterCore r(gpt2(), options());
  RouterOutput out;
  r.on_submit(zmq("a"), text_job(7, "x"), 0, out);  // will be streaming
  r.on_submit(zmq("b"), text_job(3, "y"), 0, out);  // still queued
  r.on_submit(zmq("b"), text_job(4, "z"), 0, out);  // done before the abort
  const auto acc = of<Accepted>(out);
  ASSERT_EQ(acc.size(), 3u);
  RouterOutput ev;
  r.on_events({scheduled(acc[0].request_id), token(acc[0].request_id, 40), scheduled(acc[2].request_id),
               finished(acc[2].request_id, core::FinishReason::kLength)},
              2, ev);
  r.begin_shutdown();
  RouterOutput ab;
  EXPECT_EQ(r.abort_all("stopped", 9, ab), 2u);
  EXPECT_TRUE(r.idle());
  ASSERT_EQ(ab.replies.size(), 2u);
  std::map<std::string, Finished> by_client;  // by routing id
  for (const Reply& reply : ab.replies) by_client[reply.client.peer] = std::get<Finished>(reply.message);
  EXPECT_EQ(by_client["a"].tag, 7u);
  EXPECT_EQ(by_client["a"].finish_reason, core::FinishReason::kError);
  EXPECT_EQ(by_client["a"].error, "stopped");
  EXPECT_EQ(by_client["a"].usage.completion_tokens, 1);
  EXPECT_EQ(by_client["b"].tag, 3u);
  EXPECT_EQ(by_client["b"].usage.completion_tokens, 0);
  ASSERT_EQ(ab.commands.size(), 2u) << "the batcher frees both";
  for (const auto& cmd : ab.commands)
    EXPECT_EQ(std::get<FinishCommand>(cmd).reason, core::FinishReason::kCancelled);
  RouterOutput again;
  EXPECT_EQ(r.abort_all("stopped", 10, again), 0u);
  r.on_events({token(acc[1].request_id, 5)}, 11, again);
  EXPECT_TRUE(again.replies.empty()) << "nothing after the end";
}

TEST(RouterCore, ShuttingDownRefusesNewJobs) {
  RouterCore r(gpt2(), options());
  r.begin_shutdown();
  RouterOutput out;
  r.on_submit(zmq("a"), text_job(1, "x"), 0, out);
  ASSERT_EQ(of<Rejected>(out).size(), 1u);
  EXPECT_EQ(of<Rejected>(out)[0].code, RejectCode::kShuttingDown);
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

core::RequestEvent prompt_scores(uint64_t id, int32_t start, std::vector<int32_t> ids) {
  core::RequestEvent ev;
  ev.request_id = id;
  ev.kind = core::EventKind::kPromptLogprobs;
  ev.prompt_start = start;
  for (int32_t t : ids) ev.prompt_logprobs.push_back({t, -0.5f * static_cast<float>(t % 7), {}, 2});
  return ev;
}

TEST(RouterCore, PromptLogprobsReachTheClientOnceWholeBeforeAnyToken) {
  RouterCore r(gpt2(), options());
  RouterOutput out;
  Job j = text_job(9, "The quick brown fox", 0);  // max_tokens 0: only with prompt logprobs
  r.on_submit(zmq("a"), j, 0, out);
  ASSERT_EQ(of<Rejected>(out).size(), 1u);
  EXPECT_NE(of<Rejected>(out)[0].message.find("max_tokens"), std::string::npos);
  j.prompt_logprobs = 1;
  out = {};
  r.on_submit(zmq("a"), j, 0, out);
  ASSERT_EQ(of<Accepted>(out).size(), 1u);
  const auto& req = std::get<core::Request>(out.commands.at(0));
  EXPECT_EQ(req.sampling.prompt_logprobs, 1);
  EXPECT_EQ(req.max_tokens, 0);
  const uint64_t id = of<Accepted>(out)[0].request_id;
  const std::vector<int32_t> prompt = gpt2().encode("The quick brown fox");
  ASSERT_EQ(prompt.size(), 4u);
  RouterOutput s;
  r.on_events({scheduled(id), prompt_scores(id, 1, {prompt[1], prompt[2]})}, 1, s);
  EXPECT_TRUE(of<Tokens>(s).empty()) << "nothing until every position has come";
  // A repeat of position 2 (a moved request scored again) is skipped.
  r.on_events({prompt_scores(id, 2, {prompt[2], prompt[3]}), finished(id, core::FinishReason::kLength)}, 2, s);
  const auto tokens = of<Tokens>(s);
  ASSERT_EQ(tokens.size(), 1u);
  EXPECT_EQ(tokens[0].tag, 9u);
  EXPECT_EQ(tokens[0].prompt_ids, prompt);
  EXPECT_EQ(tokens[0].prompt_text, "The quick brown fox");
  ASSERT_EQ(tokens[0].prompt_logprobs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(tokens[0].prompt_logprobs[i].id, prompt[i + 1]);
  EXPECT_TRUE(tokens[0].ids.empty());
  ASSERT_EQ(of<Finished>(s).size(), 1u);
  EXPECT_EQ(of<Finished>(s)[0].usage.completion_tokens, 0);

  // A one-token prompt has nothing to score: its prompt goes out when it is scheduled.
  Job one = text_job(10, "Hi", 1);
  one.prompt_logprobs = 0;
  RouterOutput o2;
  r.on_submit(zmq("a"), one, 3, o2);
  const uint64_t id2 = of<Accepted>(o2)[0].request_id;
  RouterOutput s2;
  r.on_events({scheduled(id2), token(id2, 11)}, 4, s2);
  const auto t2 = of<Tokens>(s2);
  ASSERT_EQ(t2.size(), 2u);
  EXPECT_EQ(t2[0].prompt_ids, gpt2().encode("Hi"));
  EXPECT_TRUE(t2[0].prompt_logprobs.empty());
  EXPECT_EQ(t2[1].ids, (std::vector<int32_t>{11}));
  // A prompt that fills every position is fine when nothing is generated.
  Job full;
  full.tag = 11;
  full.prompt_ids = std::vector<int32_t>(64, 318);
  full.max_tokens = 0;
  full.prompt_logprobs = 0;
  RouterOutput o3;
  r.on_submit(zmq("a"), full, 5, o3);
  EXPECT_EQ(of<Accepted>(o3).size(), 1u);
  full.max_tokens = 1;
  full.tag = 12;
  RouterOutput o4;
  r.on_submit(zmq("a"), full, 5, o4);
  ASSERT_EQ(of<Rejected>(o4).size(), 1u);
  EXPECT_EQ(of<Rejected>(o4)[0].code, RejectCode::kTooLong);
}

}  // namespace
}  // namespace troupe::actors
