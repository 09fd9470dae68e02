// Every message type survives encode -> decode unchanged; frames written by
// another encoder (other key order, unknown keys, float64s, integers for
// floats, longer records) are read too.
#include <gtest/gtest.h>

#include <msgpack.hpp>

#include "frame_edit.hpp"
#include "sample_messages.hpp"
#include "transport/protocol.hpp"

namespace troupe::transport {
namespace {

Message decode_ok(const std::string& bytes) {
  Decoded d = decode(bytes);
  EXPECT_TRUE(d.ok()) << to_string(d.error.code) << ": " << d.error.message;
  if (!d.ok()) return Error{};
  return *d.message;
}

TEST(ProtocolRoundTrip, EveryMessageTypeReencodesToTheSameBytes) {
  std::set<std::string> seen;
  for (const Message& m : test::sample_messages()) {
    const std::string bytes = encode(m);
    Decoded d = decode(bytes);
    ASSERT_TRUE(d.ok()) << type_name(m) << ": " << d.error.message;
    EXPECT_EQ(d.message->index(), m.index());
    EXPECT_STREQ(type_name(*d.message), type_name(m));
    // Every field of the samples differs from its default, so a field lost
    // on either side changes the bytes.
    EXPECT_EQ(encode(*d.message), bytes) << type_name(m);
    seen.insert(type_name(m));
  }
  EXPECT_EQ(seen.size(), std::variant_size_v<Message>) << "a message type has no sample";
}

TEST(ProtocolRoundTrip, SubmitFieldsAndPromptForms) {
  auto all = test::sample_messages();
  auto text = std::get<Submit>(decode_ok(encode(all[0])));
  EXPECT_EQ(text.tag, 42u);
  ASSERT_TRUE(text.prompt.has_value());
  EXPECT_EQ(*text.prompt, "Hello, \xe4\xb8\x96\xe7\x95\x8c");
  EXPECT_FALSE(text.prompt_ids.has_value());
  EXPECT_EQ(text.max_tokens, 33);
  EXPECT_FLOAT_EQ(text.temperature, 0.5f);
  EXPECT_EQ(text.top_k, 7);
  EXPECT_FLOAT_EQ(text.top_p, 0.75f);
  EXPECT_EQ(text.seed, std::optional<uint64_t>(1ull << 63));
  EXPECT_EQ(text.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(text.logprobs, 3);
  EXPECT_TRUE(text.ignore_eos);
  EXPECT_EQ(text.priority, -2);
  EXPECT_FLOAT_EQ(text.presence_penalty, 0.25f);
  EXPECT_FLOAT_EQ(text.frequency_penalty, -2.0f);
  EXPECT_EQ(text.logit_bias, (std::vector<std::pair<int32_t, float>>{{50256, -100.0f}, {11, 3.5f}}));
  EXPECT_FLOAT_EQ(text.repetition_penalty, 1.5f);

  auto ids = std::get<Submit>(decode_ok(encode(all[1])));
  EXPECT_FALSE(ids.prompt.has_value());
  EXPECT_EQ(ids.prompt_ids, (std::optional<std::vector<int32_t>>{{1, 2, 50000}}));
  EXPECT_FALSE(ids.seed.has_value());
}

TEST(ProtocolRoundTrip, PlanAndResultFields) {
  auto plan = std::get<Plan>(decode_ok(encode(Plan{3, test::sample_plan()})));
  EXPECT_EQ(plan.worker, 3u);
  const core::StepPlan& p = plan.plan;
  EXPECT_EQ(p.step_id, 77u);
  EXPECT_EQ(p.drop, (std::vector<uint64_t>{3, 1ull << 40}));
  ASSERT_EQ(p.new_seqs.size(), 3u);
  EXPECT_EQ(p.new_seqs[0].tokens, (std::vector<int32_t>{50256, 0, 318, 1000000}));
  EXPECT_EQ(p.new_seqs[0].num_cached, 2);
  EXPECT_EQ(p.new_seqs[0].block_table, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(p.new_seqs[0].sampling.seed, 0xdeadbeefcafeull);
  EXPECT_EQ(p.new_seqs[0].sampling.top_k, 40);
  EXPECT_EQ(p.new_seqs[0].sampling.logprobs, 5);
  EXPECT_EQ(p.new_seqs[0].num_generated, 0);
  EXPECT_FALSE(p.new_seqs[0].sampling.adjusts_logits());
  EXPECT_EQ(p.new_seqs[1].num_generated, 7);
  EXPECT_FLOAT_EQ(p.new_seqs[1].sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.new_seqs[1].sampling.frequency_penalty, -1.25f);
  EXPECT_EQ(p.new_seqs[1].sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{3, -100.0f}, {50256, 7.5f}}));
  EXPECT_FLOAT_EQ(p.new_seqs[1].sampling.repetition_penalty, 1.25f);
  ASSERT_EQ(p.work.size(), 2u);
  EXPECT_EQ(p.work[1].seq_id, 12u);
  EXPECT_EQ(p.work[1].start_pos, 1023);
  EXPECT_EQ(p.work[1].new_blocks, (std::vector<int32_t>{6}));
  EXPECT_TRUE(p.work[0].sample);
  EXPECT_FALSE(p.work[1].sample);

  auto res = std::get<Result>(decode_ok(encode(Result{2, test::sample_result()})));
  const core::StepResult& r = res.result;
  ASSERT_EQ(r.outputs.size(), 3u);
  EXPECT_EQ(r.outputs[0].token.id, 318);
  EXPECT_TRUE(r.outputs[0].token.top.empty());
  EXPECT_FLOAT_EQ(r.outputs[1].token.logprob, -0.25f);
  ASSERT_EQ(r.outputs[1].token.top.size(), 2u);
  EXPECT_EQ(r.outputs[1].token.top[1].first, 13);
  EXPECT_TRUE(std::isinf(r.outputs[2].token.logprob) && r.outputs[2].token.logprob < 0);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].error, "unknown sequence");
  EXPECT_TRUE(r.failures[0].retryable);
  EXPECT_DOUBLE_EQ(r.forward_ms, 3.25);
  EXPECT_DOUBLE_EQ(r.idle_ms, 0.125);
  ASSERT_EQ(r.prompt_scores.size(), 1u);
  EXPECT_EQ(r.prompt_scores[0].seq_id, 13u);
  EXPECT_EQ(r.prompt_scores[0].start, 1);
  ASSERT_EQ(r.prompt_scores[0].tokens.size(), 2u);
  EXPECT_EQ(r.prompt_scores[0].tokens[0].id, 2);
  EXPECT_EQ(r.prompt_scores[0].tokens[0].rank, 7);
  EXPECT_FLOAT_EQ(r.prompt_scores[0].tokens[0].logprob, -3.5f);
  EXPECT_EQ(r.prompt_scores[0].tokens[0].top[1], (std::pair<int32_t, float>{9, -1.0f}));
  ASSERT_EQ(p.new_seqs.size(), 3u);
  EXPECT_EQ(p.new_seqs[2].sampling.prompt_logprobs, 2);
  EXPECT_EQ(p.new_seqs[1].sampling.prompt_logprobs, -1);
}

TEST(ProtocolRoundTrip, AWorkersDtypesTravelAndDefaultToFloat32) {
  auto reg = std::get<Register>(decode_ok(encode(test::sample_messages()[10])));
  ASSERT_EQ(reg.workers.size(), 2u);
  EXPECT_EQ(reg.workers[0].dtype, "float32");
  EXPECT_EQ(reg.workers[1].dtype, "bfloat16");
  EXPECT_EQ(reg.workers[0].kv_dtype, "float32");
  EXPECT_EQ(reg.workers[1].kv_dtype, "bfloat16");
  EXPECT_EQ(encode(test::sample_messages()[10]).find("float32"), std::string::npos)
      << "float32 is the default: not written (what a node from before --dtype sends)";
}

TEST(ProtocolRoundTrip, PromptLogprobsCarryThePromptsIds) {
  auto all = test::sample_messages();
  EXPECT_EQ(std::get<Submit>(decode_ok(encode(all[0]))).prompt_logprobs, 4);
  EXPECT_EQ(std::get<Submit>(decode_ok(encode(Submit{}))).prompt_logprobs, -1);
  const Tokens& sent = std::get<Tokens>(all.back());
  auto t = std::get<Tokens>(decode_ok(encode(sent)));
  EXPECT_EQ(t.prompt_ids, (std::vector<int32_t>{15496, 11, 995}));
  ASSERT_EQ(t.prompt_logprobs.size(), 2u);
  EXPECT_EQ(t.prompt_logprobs[0].id, 11);
  EXPECT_EQ(t.prompt_logprobs[1].id, 995);
  EXPECT_EQ(t.prompt_logprobs[1].rank, 50257);
  EXPECT_TRUE(std::isinf(t.prompt_logprobs[1].logprob));
  EXPECT_EQ(t.prompt_logprobs[0].top, (std::vector<std::pair<int32_t, float>>{{13, -1.0f}}));
  EXPECT_EQ(t.prompt_text, "Hello, world");
  // Scores that do not match the prompt's length are a bad field, not a crash.
  Tokens bad = sent;
  bad.prompt_logprobs.pop_back();
  const Decoded d = decode(encode(bad));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error.code, ErrorCode::kBadField);
}

TEST(ProtocolRoundTrip, TokenLogprobsCarryTheirIds) {
  auto all = test::sample_messages();
  auto t = std::get<Tokens>(decode_ok(encode(all[4])));
  ASSERT_EQ(t.logprobs.size(), 2u);
  EXPECT_EQ(t.logprobs[0].id, 995);
  EXPECT_EQ(t.logprobs[1].id, 13);
  EXPECT_EQ(t.logprobs[0].top[1], (std::pair<int32_t, float>{1, -3.0f}));
}

// A frame as another encoder (say Python's msgpack) might write it: "t" last,
// unknown keys of every kind, float64, an integer temperature, nil seed.
TEST(ProtocolRoundTrip, ReadsOtherKeyOrdersUnknownKeysAndNumberForms) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(10);
  pk.pack(std::string("future_field"));
  pk.pack_map(1);
  pk.pack(std::string("nested"));
  pk.pack(std::vector<int>{1, 2, 3});
  pk.pack(std::string("v"));
  pk.pack(1);
  pk.pack(std::string("prompt_ids"));
  pk.pack(std::vector<int64_t>{5, 6});
  pk.pack(std::string("temperature"));
  pk.pack(0);  // an integer where a float goes
  pk.pack(std::string("top_p"));
  pk.pack_double(0.5);
  pk.pack(std::string("seed"));
  pk.pack_nil();  // nil: absent
  pk.pack(std::string("tag"));
  pk.pack(uint64_t{7});
  pk.pack(std::string("blob"));
  pk.pack_bin(3);
  pk.pack_bin_body("\x00\x01\x02", 3);
  pk.pack(std::string("p"));
  pk.pack(std::string("troupe"));
  pk.pack(std::string("t"));
  pk.pack(std::string("submit"));
  auto s = std::get<Submit>(decode_ok(std::string(buf.data(), buf.size())));
  EXPECT_EQ(s.tag, 7u);
  EXPECT_EQ(s.prompt_ids, (std::optional<std::vector<int32_t>>{{5, 6}}));
  EXPECT_EQ(s.temperature, 0.0f);
  EXPECT_EQ(s.top_p, 0.5f);
  EXPECT_FALSE(s.seed.has_value());
  EXPECT_EQ(s.max_tokens, 16) << "absent keys keep their defaults";
}

// A plan frame up to its `plan` value, which the caller packs.
void pack_plan_frame_start(msgpack::packer<msgpack::sbuffer>& pk) {
  test::pack_header(pk, "plan", 2);
  pk.pack(std::string("worker"));
  pk.pack(0);
  pk.pack(std::string("plan"));
}

// Records (msgpack arrays) from a newer peer may be longer: the extra
// elements are skipped.
TEST(ProtocolRoundTrip, LongerRecordsFromANewerPeerAreRead) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pack_plan_frame_start(pk);
  pk.pack_array(5);  // [step_id, drop, new_seqs, work, <future>]
  pk.pack(5);
  pk.pack_array(0);
  pk.pack_array(0);
  pk.pack_array(1);
  pk.pack_array(6);  // work item with a sixth element
  pk.pack(8);
  pk.pack(100);
  pk.pack(1);
  pk.pack_array(0);
  pk.pack(true);
  pk.pack(std::string("future"));
  pk.pack(std::map<std::string, int>{{"x", 1}});
  auto p = std::get<Plan>(decode_ok(std::string(buf.data(), buf.size())));
  ASSERT_EQ(p.plan.work.size(), 1u);
  EXPECT_EQ(p.plan.work[0].seq_id, 8u);
  EXPECT_EQ(p.plan.work[0].start_pos, 100);
  EXPECT_TRUE(p.plan.work[0].sample);
}

// A sequence that adjusts no logits is written in the short layout (5
// sampling elements, no num_generated): what every peer before the
// adjustments wrote and reads.
TEST(ProtocolRoundTrip, PlainSamplingKeepsTheShortLayout) {
  core::StepPlan plain = test::sample_plan();
  plain.new_seqs.resize(1);
  core::StepPlan adjusted = plain;
  adjusted.new_seqs[0].sampling.logit_bias = {{1, 1.5f}};
  const size_t bytes = encode(Plan{0, plain}).size();
  // Four elements more: presence and frequency (0: msgpack-c writes an
  // integral float as an integer, 1 byte each), the list (header 1 byte) of
  // one [id, bias] pair (header 1, id 1, float32 5), repetition (1: 1 byte).
  EXPECT_EQ(encode(Plan{0, adjusted}).size(), bytes + 1 + 1 + 1 + 1 + 1 + 5 + 1);
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pack_plan_frame_start(pk);
  pk.pack_array(4);
  pk.pack(5);
  pk.pack_array(0);
  pk.pack_array(1);
  pk.pack(std::make_tuple(9, std::vector<int>{1, 2}, 0, std::vector<int>{3},
                          std::make_tuple(0.5, 3, 1.0, 7, -1)));
  pk.pack_array(0);
  auto p = std::get<Plan>(decode_ok(std::string(buf.data(), buf.size())));
  ASSERT_EQ(p.plan.new_seqs.size(), 1u);
  EXPECT_EQ(p.plan.new_seqs[0].num_generated, 0);
  EXPECT_FLOAT_EQ(p.plan.new_seqs[0].sampling.temperature, 0.5f);
  EXPECT_FALSE(p.plan.new_seqs[0].sampling.adjusts_logits());
}

TEST(ProtocolRoundTrip, ErrorReplyCarriesCodeMessageAndTag) {
  Decoded d = decode(encode(Submit{}).substr(0, 5));
  ASSERT_FALSE(d.ok());
  Error e = error_reply(d.error);
  EXPECT_EQ(e.code, d.error.code);
  EXPECT_EQ(e.message, d.error.message);
  auto back = std::get<Error>(decode_ok(encode(e)));
  EXPECT_EQ(back.code, ErrorCode::kMalformed);
  EXPECT_EQ(back.message, d.error.message);
}

}  // namespace
}  // namespace troupe::transport
