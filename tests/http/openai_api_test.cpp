// OpenAI's completions API mapped onto troupe's jobs and replies: parsing,
// errors in OpenAI's shape, seeds of n > 1, responses and stream chunks.
#include "cluster/http/openai_api.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "actors/router/router_core.hpp"
#include "model/text/tokenizer.hpp"
#include "test_utils.hpp"

namespace troupe::cluster::openai {
namespace {

using nlohmann::json;

CompletionRequest ok(const std::string& body) {
  auto r = parse_completion_request(body, "gpt2");
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::get<CompletionRequest>(r);
}

ApiError bad(const std::string& body) {
  auto r = parse_completion_request(body, "gpt2");
  if (!std::holds_alternative<ApiError>(r)) {
    ADD_FAILURE() << body << " was accepted";
    return {};
  }
  return std::get<ApiError>(r);
}

const model::Tokenizer& tokenizer() {
  static model::Tokenizer t = model::Tokenizer::from_dir(test::tokenizer_dir());
  return t;
}

TEST(OpenAiApi, StringPromptTakesOpenAisDefaults) {
  const CompletionRequest r = ok(R"({"model": "gpt2", "prompt": "Hello"})");
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(r.jobs[0].prompt, std::optional<std::string>("Hello"));
  EXPECT_FALSE(r.jobs[0].prompt_ids.has_value());
  EXPECT_EQ(r.jobs[0].max_tokens, 16);
  EXPECT_FLOAT_EQ(r.jobs[0].temperature, 1.0f);
  EXPECT_FALSE(r.jobs[0].seed.has_value());
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.n, 1);
}

TEST(OpenAiApi, EveryPromptFormBecomesJobsInOpenAisOrder) {
  EXPECT_EQ(ok(R"({"prompt": [15496, 995]})").jobs[0].prompt_ids, (std::vector<int32_t>{15496, 995}));
  const CompletionRequest batch = ok(R"({"prompt": ["a", "b"], "n": 3, "max_tokens": 4, "temperature": 0,
                                         "top_p": 0.5, "top_k": -1, "stop": "x", "logprobs": 2,
                                         "ignore_eos": true, "stream": true,
                                         "stream_options": {"include_usage": true}})");
  ASSERT_EQ(batch.jobs.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(batch.jobs[i].tag, i);
    EXPECT_EQ(*batch.jobs[i].prompt, i < 3 ? "a" : "b");
    EXPECT_EQ(batch.jobs[i].max_tokens, 4);
    EXPECT_EQ(batch.jobs[i].top_k, 0) << "-1 means off, as in vLLM";
    EXPECT_EQ(batch.jobs[i].stop, std::vector<std::string>{"x"});
    EXPECT_EQ(batch.jobs[i].logprobs, 2);
    EXPECT_TRUE(batch.jobs[i].ignore_eos);
  }
  EXPECT_TRUE(batch.stream);
  EXPECT_TRUE(batch.include_usage);
  const CompletionRequest ids = ok(R"({"prompt": [[1, 2], [3]]})");
  ASSERT_EQ(ids.jobs.size(), 2u);
  EXPECT_EQ(*ids.jobs[1].prompt_ids, std::vector<int32_t>{3});
}

TEST(OpenAiApi, ChoicesGetTheirOwnSeedsAndChoiceZeroKeepsTheRequests) {
  const CompletionRequest r = ok(R"({"prompt": ["a", "b"], "n": 3, "seed": 42})");
  ASSERT_EQ(r.jobs.size(), 6u);
  EXPECT_EQ(*r.jobs[0].seed, 42u);
  EXPECT_EQ(*r.jobs[3].seed, 42u) << "each prompt's first choice is what n = 1 would give";
  EXPECT_NE(*r.jobs[1].seed, *r.jobs[2].seed);
  EXPECT_NE(*r.jobs[1].seed, 42u);
  EXPECT_EQ(*r.jobs[1].seed, *r.jobs[4].seed);
  EXPECT_EQ(*r.jobs[1].seed, seed_for_choice(42, 1));
  EXPECT_EQ(*ok(R"({"prompt": "a", "seed": -1})").jobs[0].seed, ~uint64_t{0}) << "int64 seeds wrap";
}

// Where OpenAI's API (and vLLM's) take an integral float for an integer.
TEST(OpenAiApi, IntegralFloatsAreIntegers) {
  const CompletionRequest r = ok(R"({"prompt": [15496, 995.0], "max_tokens": 2.0, "n": 3.0, "top_k": -1.0})");
  ASSERT_EQ(r.jobs.size(), 3u);
  EXPECT_EQ(r.jobs[0].max_tokens, 2);
  EXPECT_EQ(*r.jobs[0].prompt_ids, (std::vector<int32_t>{15496, 995}));
}

TEST(OpenAiApi, BadRequestsSayWhichField) {
  struct Case {
    const char* body;
    int status;
    const char* param;
    const char* words;
  };
  const Case cases[] = {
      {R"({"max_tokens": 5})", 400, "prompt", "prompt is required"},
      {R"({"prompt": 5})", 400, "prompt", "prompt must be"},
      {R"({"prompt": []})", 400, "prompt", "prompt must be"},
      {R"({"prompt": ["a", 7]})", 400, "prompt", "prompt[1] must be"},
      {R"({"prompt": [1, "x"]})", 400, "prompt[1]", "must be an integer"},
      {R"({"prompt": "a", "max_tokens": "5"})", 400, "max_tokens", "must be an integer, got a string"},
      {R"({"prompt": "a", "max_tokens": 0})", 400, "max_tokens", "0 only with echo or prompt_logprobs"},
      {R"({"prompt": "a", "max_tokens": -1, "echo": true})", 400, "max_tokens", "[0, "},
      {R"({"prompt": "a", "max_tokens": 2.5})", 400, "max_tokens", "must be an integer, got 2.5"},
      {R"({"prompt": "a", "max_tokens": 0.0})", 400, "max_tokens", "0 only with echo"},
      {R"({"prompt": "a", "prompt_logprobs": -1})", 400, "prompt_logprobs", "[0, "},
      {R"({"prompt": "a", "prompt_logprobs": "5"})", 400, "prompt_logprobs", "must be an integer"},
      {R"({"prompt": "a", "n": 1e300})", 400, "n", "must be an integer, got 1e+300"},
      {R"({"prompt": "a", "n": 0})", 400, "n", "[1, 256]"},
      {R"({"prompt": ["a", "b"], "n": 200})", 400, "n", "over 256 choices"},
      {R"({"prompt": "a", "temperature": "hot"})", 400, "temperature", "must be a number"},
      {R"({"prompt": "a", "stop": [1]})", 400, "stop", "stop[0] must be a string"},
      {R"({"prompt": "a", "stream": "yes"})", 400, "stream", "true or false"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", 400, "stream_options",
       "stream: true"},
      {R"({"prompt": "a", "echo": "yes"})", 400, "echo", "true or false"},
      {R"({"prompt": "a", "best_of": 2})", 400, "best_of", "not supported"},
      {R"({"prompt": "a", "repetition_penalty": "1.2"})", 400, "repetition_penalty", "must be a number"},
      {R"({"prompt": "a", "min_tokens": 3})", 400, "min_tokens", "not supported"},
      {R"({"prompt": "a", "presence_penalty": "high"})", 400, "presence_penalty", "must be a number"},
      {R"({"prompt": "a", "frequency_penalty": true})", 400, "frequency_penalty", "must be a number"},
      {R"({"prompt": "a", "logit_bias": [[1, 2]]})", 400, "logit_bias", "must be an object"},
      {R"({"prompt": "a", "logit_bias": {"x1": 2}})", 400, "logit_bias", "token ids such as"},
      {R"({"prompt": "a", "logit_bias": {"-1": 2}})", 400, "logit_bias", "token ids such as"},
      {R"({"prompt": "a", "logit_bias": {"1": "2"}})", 400, "logit_bias", "must be a number"},
      {R"({"prompt": "a", "model": "gpt-4"})", 404, "model", "does not exist"},
      {R"([1, 2])", 400, "", "JSON object"},
      {R"({"prompt": )", 400, "", "not valid JSON"},
      // Numbers past a double's range: a 400 naming where, not a 500 (nlohmann throws out_of_range).
      {R"({"prompt": "a", "temperature": 1e999})", 400, "temperature", "the number 1e999 is out of range"},
      {R"({"prompt": "a", "logit_bias": {"50256": -1e400}})", 400, "logit_bias.50256",
       "-1e400 is out of range"},
      {R"({"prompt": [[1, 2], [3, 1e999]]})", 400, "prompt[1][1]", "out of range"},
      {R"(1e999)", 400, "(the whole body)", "out of range"},
  };
  for (const Case& c : cases) {
    const ApiError e = bad(c.body);
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.words), std::string::npos) << c.body << " -> " << e.message;
  }
  EXPECT_EQ(bad(R"({"prompt": "a", "model": "gpt-4"})").code, "model_not_found");
  // What the defaults are may be sent explicitly.
  ok(R"({"prompt": "a", "echo": false, "best_of": 1, "presence_penalty": 0, "logit_bias": {}, "suffix": null,
         "user": "me", "max_tokens": null})");
}

TEST(OpenAiApi, LogitAdjustmentsReachEveryJob) {
  const CompletionRequest r = ok(R"({"prompt": ["a", "b"], "n": 2, "presence_penalty": 0.5,
                                     "frequency_penalty": -1, "logit_bias": {"50256": -100, "11": 2.5},
                                     "repetition_penalty": 1.3})");
  ASSERT_EQ(r.jobs.size(), 4u);
  for (const transport::Submit& j : r.jobs) {
    EXPECT_FLOAT_EQ(j.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(j.frequency_penalty, -1.0f);
    EXPECT_FLOAT_EQ(j.repetition_penalty, 1.3f);
    auto bias = j.logit_bias;
    std::sort(bias.begin(), bias.end());
    EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{11, 2.5f}, {50256, -100.0f}}));
  }
  const CompletionRequest plain = ok(R"({"prompt": "a"})");
  EXPECT_EQ(plain.jobs[0].presence_penalty, 0.0f);
  EXPECT_TRUE(plain.jobs[0].logit_bias.empty());
}

TEST(OpenAiApi, ErrorsHaveOpenAisShapeAndRejectionsTheirStatus) {
  const json j = to_json(ApiError{400, "no", "invalid_request_error", "n", ""});
  EXPECT_EQ(j, json::parse(R"({"error": {"message": "no", "type": "invalid_request_error", "param": "n",
                                         "code": null}})"));
  using transport::RejectCode;
  EXPECT_EQ(from_rejected({1, RejectCode::kBusy, "full"}).status, 429);
  EXPECT_EQ(from_rejected({1, RejectCode::kInvalid, "bad"}).status, 400);
  EXPECT_EQ(from_rejected({1, RejectCode::kTooLong, "long"}).status, 413);
  EXPECT_EQ(from_rejected({1, RejectCode::kNoWorkers, "none"}).status, 503);
  EXPECT_EQ(from_rejected({1, RejectCode::kShuttingDown, "bye"}).status, 503);
  EXPECT_EQ(from_rejected({1, RejectCode::kBusy, "full"}).message, "full");
}

// A job the router refuses names its field as `param`, from the router's own messages.
TEST(OpenAi, RefusedJobsNameTheirFieldAsParam) {
  const model::Tokenizer& tok = tokenizer();
  actors::RouterOptions options;
  auto job = [] {
    transport::Submit j;
    j.prompt = "Hello";
    j.max_tokens = 4;
    return j;
  };
  std::vector<std::pair<transport::Submit, std::string>> cases;
  auto add = [&](const std::function<void(transport::Submit&)>& edit, const std::string& param) {
    transport::Submit j = job();
    edit(j);
    cases.emplace_back(j, param);
  };
  add([](auto& j) { j.temperature = -1; }, "temperature");
  add([](auto& j) { j.top_k = -1; }, "top_k");
  add([](auto& j) { j.top_p = 0; }, "top_p");
  add([](auto& j) { j.logprobs = 21; }, "logprobs");
  add([](auto& j) { j.prompt = ""; }, "prompt");
  add([](auto& j) { j.prompt.reset(), j.prompt_ids = std::vector<int32_t>{99999}; }, "prompt");
  add([](auto& j) { j.max_tokens = 0; }, "max_tokens");
  add([](auto& j) { j.stop = std::vector<std::string>(17, "x"); }, "stop");
  add([](auto& j) { j.stop = {""}; }, "stop");
  add([](auto& j) { j.stop = {std::string(2000, 'x')}; }, "stop");
  add([](auto& j) { j.presence_penalty = 2.5f; }, "presence_penalty");
  add([](auto& j) { j.frequency_penalty = -3.0f; }, "frequency_penalty");
  add([](auto& j) { j.logit_bias = {{50257, 1.0f}}; }, "logit_bias");
  add([](auto& j) { j.logit_bias = {{5, 1.0f}, {5, 2.0f}}; }, "logit_bias");
  add([](auto& j) { j.logit_bias = {{5, 1000.0f}}; }, "logit_bias");
  add([](auto& j) { j.repetition_penalty = 0.0f; }, "repetition_penalty");
  for (const auto& [j, param] : cases) {
    const auto checked = actors::admit_job(j, tok, options);
    ASSERT_TRUE(std::holds_alternative<transport::Rejected>(checked)) << param;
    const ApiError e = from_rejected(std::get<transport::Rejected>(checked));
    EXPECT_EQ(e.status, 400) << e.message;
    EXPECT_EQ(e.param, param) << e.message;
  }
}

transport::Tokens tokens(uint64_t tag, const std::string& text, int32_t id) {
  transport::Tokens t;
  t.tag = tag;
  t.text = text;
  t.ids = {id};
  return t;
}

transport::Finished finished(uint64_t tag, core::FinishReason why, int32_t prompt, int32_t out) {
  transport::Finished f;
  f.tag = tag;
  f.finish_reason = why;
  f.usage.prompt_tokens = prompt;
  f.usage.completion_tokens = out;
  f.usage.cached_tokens = 1;
  return f;
}

TEST(OpenAiApi, BuilderAssemblesChoicesAndCountsEachPromptOnce) {
  const CompletionRequest r = ok(R"({"prompt": "Hello", "n": 2, "stream": true,
                                     "stream_options": {"include_usage": true}})");
  CompletionBuilder b(r, "cmpl-1", 1700000000, "gpt2", tokenizer());
  auto c = b.on_tokens(tokens(1, " world", 995));
  ASSERT_TRUE(c);
  EXPECT_EQ((*c)["choices"][0]["index"], 1);
  EXPECT_EQ((*c)["choices"][0]["text"], " world");
  EXPECT_TRUE((*c)["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE((*c)["usage"].is_null()) << "include_usage: every chunk says usage: null";
  EXPECT_EQ((*c)["object"], "text_completion");
  b.on_tokens(tokens(0, "!", 0));
  EXPECT_FALSE(b.on_tokens(tokens(7, "x", 87))) << "not one of ours";
  auto f0 = b.on_finished(finished(0, core::FinishReason::kEos, 3, 2));
  EXPECT_EQ((*f0)["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(b.done());
  b.on_finished(finished(1, core::FinishReason::kLength, 3, 4));
  EXPECT_FALSE(b.on_finished(finished(1, core::FinishReason::kLength, 3, 4))) << "a choice ends once";
  ASSERT_TRUE(b.done());
  EXPECT_FALSE(b.failure());
  const json resp = b.response();
  EXPECT_EQ(resp["id"], "cmpl-1");
  EXPECT_EQ(resp["choices"][0]["text"], "!");
  EXPECT_EQ(resp["choices"][1]["text"], " world");
  EXPECT_EQ(resp["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(resp["usage"]["prompt_tokens"], 3) << "one prompt, whatever n is";
  EXPECT_EQ(resp["usage"]["completion_tokens"], 6);
  EXPECT_EQ(resp["usage"]["total_tokens"], 9);
  EXPECT_EQ(b.usage_chunk()["choices"], json::array());
  EXPECT_EQ(b.usage_chunk()["usage"]["completion_tokens"], 6);
}

TEST(OpenAiApi, LogprobsCarryTokenStringsAndOffsets) {
  CompletionBuilder b(ok(R"({"prompt": "Hello", "logprobs": 1})"), "cmpl-2", 0, "gpt2", tokenizer());
  transport::Tokens t = tokens(0, " world", 995);
  t.logprobs.push_back({995, -0.5f, {{11, -1.0f}}});
  auto c = b.on_tokens(t);
  const json& lp = (*c)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({" world"}));
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][0].get<double>(), -0.5);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][0][","].get<double>(), -1.0);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][0][" world"].get<double>(), -0.5) << "the chosen token is among them";
  EXPECT_EQ(lp["text_offset"], json::array({0}));
  transport::Tokens t2 = tokens(0, "!", 0);
  t2.logprobs.push_back({0, -2.0f, {}});
  EXPECT_EQ((*b.on_tokens(t2))["choices"][0]["logprobs"]["text_offset"], json::array({6}));
  b.on_finished(finished(0, core::FinishReason::kLength, 1, 2));
  EXPECT_EQ(b.response()["choices"][0]["logprobs"]["tokens"], json::array({" world", "!"}));
}

// The router's first Tokens of a job with prompt logprobs: its prompt and the scores of prompt[1..].
transport::Tokens prompt_reply(uint64_t tag, std::vector<int32_t> ids, std::vector<core::SampledToken> scores) {
  transport::Tokens t;
  t.tag = tag;
  t.prompt_ids = std::move(ids);
  t.prompt_logprobs = std::move(scores);
  return t;
}

TEST(OpenAiApi, EchoWithLogprobsScoresThePromptInOpenAisLegacyShape) {
  // What lm-evaluation-harness sends for a loglikelihood request.
  const CompletionRequest r =
      ok(R"({"prompt": "Hello world", "echo": true, "logprobs": 1, "max_tokens": 0, "temperature": 0.0})");
  ASSERT_EQ(r.jobs.size(), 1u);
  EXPECT_EQ(r.jobs[0].max_tokens, 0);
  EXPECT_EQ(r.jobs[0].prompt_logprobs, 1);
  CompletionBuilder b(r, "cmpl-4", 0, "gpt2", tokenizer());
  const std::vector<int32_t> ids = tokenizer().encode("Hello world");
  ASSERT_EQ(ids, (std::vector<int32_t>{15496, 995}));
  auto c = b.on_tokens(prompt_reply(0, ids, {{995, -2.0f, {{11, -1.5f}}, 3}}));
  ASSERT_TRUE(c);
  EXPECT_EQ((*c)["choices"][0]["text"], "Hello world");
  b.on_finished(finished(0, core::FinishReason::kLength, 2, 0));
  const json resp = b.response();
  const json& choice = resp["choices"][0];
  EXPECT_EQ(choice["text"], "Hello world");
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_FALSE(choice.contains("prompt_logprobs")) << "vLLM's field only when asked for";
  const json& lp = choice["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({"Hello", " world"}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << "nothing predicts the first token";
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][1].get<double>(), -2.0);
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][1][","].get<double>(), -1.5);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][1][" world"].get<double>(), -2.0);
  EXPECT_EQ(lp["text_offset"], json::array({0, 5}));
  EXPECT_EQ(resp["usage"]["completion_tokens"], 0);
}

TEST(OpenAiApi, EchoedPromptComesFirstThenTheCompletionWithOffsetsPastIt) {
  CompletionBuilder b(ok(R"({"prompt": [15496], "echo": true, "logprobs": 0, "max_tokens": 1, "stream": true})"),
                      "cmpl-5", 0, "gpt2", tokenizer());
  auto first = b.on_tokens(prompt_reply(0, {15496}, {}));
  EXPECT_EQ((*first)["choices"][0]["text"], "Hello");
  EXPECT_EQ((*first)["choices"][0]["logprobs"]["tokens"], json::array({"Hello"}));
  transport::Tokens t = tokens(0, " world", 995);
  t.logprobs.push_back({995, -0.5f, {}});
  auto second = b.on_tokens(t);
  EXPECT_EQ((*second)["choices"][0]["text"], " world");
  EXPECT_EQ((*second)["choices"][0]["logprobs"]["text_offset"], json::array({5}));
  b.on_finished(finished(0, core::FinishReason::kLength, 1, 1));
  EXPECT_EQ(b.response()["choices"][0]["text"], "Hello world");
  EXPECT_EQ(b.response()["choices"][0]["logprobs"]["text_offset"], json::array({0, 5}));

  // echo without logprobs needs no scores: the prompt's text rides on the first chunk.
  const CompletionRequest plain = ok(R"({"prompt": "Hi", "echo": true, "max_tokens": 1})");
  EXPECT_EQ(plain.jobs[0].prompt_logprobs, -1);
  CompletionBuilder p(plain, "cmpl-6", 0, "gpt2", tokenizer());
  EXPECT_EQ((*p.on_tokens(tokens(0, "!", 0)))["choices"][0]["text"], "Hi!");
  p.on_finished(finished(0, core::FinishReason::kLength, 1, 1));
  EXPECT_EQ(p.response()["choices"][0]["text"], "Hi!");
  EXPECT_TRUE(p.response()["choices"][0]["logprobs"].is_null());
  // ... and one that generates nothing still asks for the prompt (its whole answer).
  EXPECT_EQ(ok(R"({"prompt": "Hi", "echo": true, "max_tokens": 0})").jobs[0].prompt_logprobs, 0);
}

TEST(OpenAiApi, PromptLogprobsAreVllmsRankedDictionaries) {
  const CompletionRequest r = ok(R"({"prompt": [15496, 995], "prompt_logprobs": 1, "max_tokens": 1})");
  EXPECT_EQ(r.jobs[0].prompt_logprobs, 1);
  EXPECT_FALSE(r.echo);
  CompletionBuilder b(r, "cmpl-7", 0, "gpt2", tokenizer());
  auto c = b.on_tokens(prompt_reply(0, {15496, 995}, {{995, -2.0f, {{11, -1.5f}}, 3}}));
  EXPECT_EQ((*c)["choices"][0]["text"], "") << "the prompt is not echoed";
  EXPECT_EQ((*c)["choices"][0]["prompt_logprobs"].size(), 2u);
  b.on_tokens(tokens(0, "!", 0));
  b.on_finished(finished(0, core::FinishReason::kLength, 2, 1));
  const json resp = b.response();
  const json& pl = resp["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), 2u);
  EXPECT_TRUE(pl[0].is_null());
  EXPECT_DOUBLE_EQ(pl[1]["995"]["logprob"].get<double>(), -2.0);
  EXPECT_EQ(pl[1]["995"]["rank"], 3);
  EXPECT_EQ(pl[1]["995"]["decoded_token"], " world");
  EXPECT_EQ(pl[1]["11"]["rank"], 1);
  EXPECT_EQ(pl[1]["11"]["decoded_token"], ",");
  EXPECT_EQ(b.response()["choices"][0]["text"], "!");
}

TEST(OpenAiApi, AChoiceThatFailsFailsTheRequest) {
  CompletionBuilder b(ok(R"({"prompt": "a"})"), "cmpl-3", 0, "gpt2", tokenizer());
  transport::Finished f = finished(0, core::FinishReason::kError, 1, 0);
  f.error = "worker lost and no other worker";
  b.on_finished(f);
  ASSERT_TRUE(b.failure());
  EXPECT_EQ(b.failure()->status, 500);
  EXPECT_NE(b.failure()->message.find("worker lost"), std::string::npos);
}

TEST(OpenAiApi, DumpReplacesInvalidUtf8) { EXPECT_EQ(dump(json("a\xff")), "\"a\xEF\xBF\xBD\""); }

}  // namespace
}  // namespace troupe::cluster::openai
