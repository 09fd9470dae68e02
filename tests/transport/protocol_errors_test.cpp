// decode() on every kind of bad input: the right code, a message that names
// the problem (and the key path), never a crash or an exception.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "frame_edit.hpp"
#include "sample_messages.hpp"
#include "transport/protocol.hpp"

namespace troupe::transport {
namespace {

using test::edit_field;
using test::Packer;

DecodeError decode_error(const std::string& bytes, size_t max = kDefaultMaxFrameBytes) {
  Decoded d = decode(bytes, max);
  EXPECT_FALSE(d.ok()) << "decoded as " << type_name(*d.message);
  return d.error;
}

#define EXPECT_DECODE_ERROR(bytes, code_, substring)                                       \
  do {                                                                                     \
    DecodeError e_ = decode_error(bytes);                                                  \
    EXPECT_EQ(to_string(e_.code), std::string(to_string(code_))) << e_.message;            \
    EXPECT_NE(e_.message.find(substring), std::string::npos) << "message: " << e_.message; \
  } while (0)

std::string frame(const Message& m) { return encode(m); }
std::string submit_frame() { return frame(test::sample_messages()[0]); }

TEST(ProtocolErrors, BytesThatAreNotAFrame) {
  EXPECT_DECODE_ERROR("", ErrorCode::kMalformed, "must be a msgpack map, got the end of the frame");
  EXPECT_DECODE_ERROR("\xa5hello", ErrorCode::kMalformed, "must be a msgpack map, got a string");
  EXPECT_DECODE_ERROR("hello", ErrorCode::kMalformed, "must be a msgpack map, got an integer");
  EXPECT_DECODE_ERROR(std::string("\x93\x01\x02\x03"), ErrorCode::kMalformed, "got an array");
  EXPECT_DECODE_ERROR(std::string("\xc1"), ErrorCode::kMalformed, "0xc1");
  EXPECT_DECODE_ERROR(std::string("\x81\xa1p\xc1", 4), ErrorCode::kMalformed, "0xc1");
  // A map key that is not a string.
  EXPECT_DECODE_ERROR(std::string("\x81\x01\x02"), ErrorCode::kMalformed, "map key must be a string");
  // Bytes after the map.
  EXPECT_DECODE_ERROR(submit_frame() + "x", ErrorCode::kMalformed, "1 bytes follow the frame's map");
}

TEST(ProtocolErrors, EveryTruncationOfEveryMessageIsMalformed) {
  for (const Message& m : test::sample_messages()) {
    const std::string bytes = encode(m);
    for (size_t n = 0; n < bytes.size(); ++n) {
      Decoded d = decode(std::string_view(bytes).substr(0, n));
      ASSERT_FALSE(d.ok()) << type_name(m) << " cut at " << n;
      ASSERT_EQ(d.error.code, ErrorCode::kMalformed)
          << type_name(m) << " cut at " << n << ": " << d.error.message;
    }
  }
}

TEST(ProtocolErrors, NotATroupeFrameOrWrongVersionOrType) {
  const std::string f = submit_frame();
  EXPECT_DECODE_ERROR(edit_field(f, "p", [](Packer& p) { p.pack(std::string("other")); }),
                      ErrorCode::kMalformed, "not a troupe frame");
  EXPECT_DECODE_ERROR(test::without_field(f, "p"), ErrorCode::kMalformed, "not a troupe frame");
  DecodeError v2 = decode_error(edit_field(f, "v", [](Packer& p) { p.pack(2); }));
  EXPECT_EQ(v2.code, ErrorCode::kBadVersion);
  EXPECT_EQ(v2.message, "submit: protocol version 2 is not supported (this peer speaks version 1)");
  EXPECT_EQ(v2.tag, std::optional<uint64_t>(42)) << "the tag is still recovered";
  EXPECT_DECODE_ERROR(test::without_field(f, "v"), ErrorCode::kBadField, "submit.v: missing required key");
  EXPECT_DECODE_ERROR(edit_field(f, "v", [](Packer& p) { p.pack(std::string("1")); }), ErrorCode::kBadField,
                      "submit.v: expected an integer, got a string");
  DecodeError t = decode_error(edit_field(f, "t", [](Packer& p) { p.pack(std::string("frobnicate")); }));
  EXPECT_EQ(t.code, ErrorCode::kUnknownType);
  EXPECT_EQ(t.message, "unknown message type \"frobnicate\"");
  EXPECT_EQ(t.type, "frobnicate");
  EXPECT_DECODE_ERROR(test::without_field(f, "t"), ErrorCode::kBadField, "t: missing required key");
  EXPECT_DECODE_ERROR(edit_field(f, "t", [](Packer& p) { p.pack(3); }), ErrorCode::kBadField,
                      "t: expected a string, got an integer");
}

TEST(ProtocolErrors, OversizeFramesAreRefusedBeforeParsing) {
  const std::string f = submit_frame();
  DecodeError e = decode_error(f, f.size() - 1);
  EXPECT_EQ(e.code, ErrorCode::kTooLarge);
  EXPECT_EQ(e.message, "frame of " + std::to_string(f.size()) + " bytes is over the limit of " +
                           std::to_string(f.size() - 1) + " bytes");
  EXPECT_TRUE(e.type.empty()) << "nothing was parsed";
  EXPECT_TRUE(decode(f, f.size()).ok()) << "the limit itself is allowed";
}

// Every top-level field of every message, given a value of the wrong kind,
// is a bad_field naming "<type>.<key>".
TEST(ProtocolErrors, WrongKindForEveryFieldOfEveryMessage) {
  int checked = 0;
  for (const Message& m : test::sample_messages()) {
    const std::string f = encode(m);
    for (const std::string& key : test::frame_keys(f)) {
      if (key == "p" || key == "v" || key == "t") continue;
      const bool is_str = test::field_is_string(f, key);
      std::string bad = edit_field(f, key, [&](Packer& p) {
        if (is_str)
          p.pack(12345);
        else
          p.pack(std::string("text"));
      });
      Decoded d = decode(bad);
      ASSERT_FALSE(d.ok()) << type_name(m) << "." << key;
      EXPECT_EQ(d.error.code, ErrorCode::kBadField) << d.error.message;
      const std::string path = std::string(type_name(m)) + "." + key + ": expected ";
      EXPECT_EQ(d.error.message.rfind(path, 0), 0u) << d.error.message;
      EXPECT_NE(d.error.message.find(is_str ? "got an integer" : "got a string"), std::string::npos)
          << d.error.message;
      ++checked;
    }
  }
  EXPECT_GT(checked, 60);
}

// Every required key, removed, is named as missing.
TEST(ProtocolErrors, MissingRequiredKeysAreNamed) {
  struct Case {
    size_t sample;
    const char* key;
  };
  for (auto [sample, key] :
       {Case{0, "tag"}, Case{2, "request_id"}, Case{3, "code"}, Case{4, "ids"}, Case{6, "usage"},
        Case{6, "finish_reason"}, Case{9, "workers"}, Case{9, "uptime_s"}, Case{10, "node"},
        Case{11, "heartbeat_ms"}, Case{13, "plan"}, Case{14, "worker"}, Case{20, "message"}}) {
    const Message m = test::sample_messages()[sample];
    DecodeError e = decode_error(test::without_field(encode(m), key));
    EXPECT_EQ(e.code, ErrorCode::kBadField);
    EXPECT_EQ(e.message, std::string(type_name(m)) + "." + key + ": missing required key");
  }
}

TEST(ProtocolErrors, IntegersOutOfTheirFieldsRange) {
  const std::string f = submit_frame();
  EXPECT_DECODE_ERROR(edit_field(f, "max_tokens", [](Packer& p) { p.pack(int64_t{1} << 31); }),
                      ErrorCode::kBadField, "submit.max_tokens: 2147483648 is out of range");
  EXPECT_DECODE_ERROR(
      edit_field(f, "priority", [](Packer& p) { p.pack(std::numeric_limits<uint64_t>::max()); }),
      ErrorCode::kBadField, "submit.priority: 18446744073709551615 is out of range");
  EXPECT_DECODE_ERROR(edit_field(f, "tag", [](Packer& p) { p.pack(-1); }), ErrorCode::kBadField,
                      "submit.tag: expected an unsigned integer, got -1");
  const std::string reg = encode(test::sample_messages()[11]);
  EXPECT_DECODE_ERROR(edit_field(reg, "liveness", [](Packer& p) { p.pack(-(int64_t{1} << 40)); }),
                      ErrorCode::kBadField, "registered.liveness: -1099511627776 is out of range");
}

TEST(ProtocolErrors, FloatsMustBeFinite) {
  const std::string f = submit_frame();
  EXPECT_DECODE_ERROR(edit_field(f, "temperature", [](Packer& p) { p.pack_double(std::nan("")); }),
                      ErrorCode::kBadField, "submit.temperature: must be a finite number");
  EXPECT_DECODE_ERROR(edit_field(f, "top_p", [](Packer& p) { p.pack_float(INFINITY); }), ErrorCode::kBadField,
                      "submit.top_p: must be a finite number");
  EXPECT_DECODE_ERROR(edit_field(f, "temperature", [](Packer& p) { p.pack_double(1e300); }),
                      ErrorCode::kBadField, "submit.temperature: is out of the range of a 32-bit float");
  const std::string tokens = encode(test::sample_messages()[4]);
  EXPECT_DECODE_ERROR(edit_field(tokens, "logprobs",
                                 [](Packer& p) {
                                   p.pack_array(2);
                                   p.pack_array(2);
                                   p.pack_double(std::nan(""));
                                   p.pack_array(0);
                                   p.pack_array(2);
                                   p.pack_double(-1);
                                   p.pack_array(0);
                                 }),
                      ErrorCode::kBadField, "tokens.logprobs[0].logprob: a log-probability must be <= 0");
}

TEST(ProtocolErrors, FieldRulesBeyondTypes) {
  const std::string f = submit_frame();
  EXPECT_DECODE_ERROR(edit_field(f, "prompt_ids", [](Packer& p) { p.pack(std::vector<int>{1}); }),
                      ErrorCode::kBadField, "submit.prompt: give exactly one of");
  EXPECT_DECODE_ERROR(test::without_field(f, "prompt"), ErrorCode::kBadField,
                      "submit.prompt: give exactly one of");
  const std::string tokens = encode(test::sample_messages()[4]);
  EXPECT_DECODE_ERROR(edit_field(tokens, "ids",
                                 [](Packer& p) {
                                   p.pack(std::vector<int>{1, 2, 3});
                                 }),
                      ErrorCode::kBadField, "tokens.logprobs: has 2 entries for 3 ids");
  const std::string fin = encode(test::sample_messages()[6]);
  EXPECT_DECODE_ERROR(
      edit_field(fin, "finish_reason", [](Packer& p) { p.pack(std::string("exploded")); }),
      ErrorCode::kBadField,
      "finished.finish_reason: unknown value \"exploded\" (one of eos, length, stop, cancelled, error)");
  EXPECT_DECODE_ERROR(
      edit_field(fin, "usage",
                 [](Packer& p) {
                   p.pack(std::map<std::string, int>{{"prompt_tokens", 1}, {"completion_tokens", 2}});
                 }),
      ErrorCode::kBadField, "finished.usage.cached_tokens: missing required key");
}

TEST(ProtocolErrors, NestedPathsInPlans) {
  const std::string f = encode(Plan{0, test::sample_plan()});
  DecodeError e = decode_error(edit_field(f, "plan", [](Packer& p) {
    p.pack_array(4);
    p.pack(1);
    p.pack_array(0);
    p.pack_array(0);
    p.pack_array(2);
    p.pack(std::make_tuple(1, 0, 1, std::vector<int>{}, true));
    p.pack(std::make_tuple(2, 0, 1, std::vector<std::string>{"x"}, true));
  }));
  EXPECT_EQ(e.code, ErrorCode::kBadField);
  EXPECT_EQ(e.message, "plan.plan.work[1].new_blocks[0]: expected an integer, got a string");
  e = decode_error(edit_field(f, "plan", [](Packer& p) {
    p.pack_array(4);
    p.pack(1);
    p.pack_array(0);
    p.pack_array(0);
    p.pack_array(1);
    p.pack(std::make_tuple(1, 0, 1, std::vector<int>{}));
  }));
  EXPECT_EQ(
      e.message,
      "plan.plan.work[0]: expected [seq_id, start_pos, num_tokens, new_blocks, sample], got 4 elements");
  e = decode_error(edit_field(f, "plan", [](Packer& p) {
    p.pack(std::map<std::string, int>{{"step_id", 1}});
  }));
  EXPECT_EQ(e.message, "plan.plan: expected an array, got a map");
}

TEST(ProtocolErrors, DeepNestingIsRefusedWithoutRecursion) {
  auto nested = [](int depth) {
    return [depth](Packer& p) {
      for (int i = 0; i < depth; ++i) p.pack_array(1);
      p.pack(0);
    };
  };
  const std::string f = submit_frame();
  EXPECT_TRUE(decode(edit_field(f, "future", nested(15))).ok()) << "unknown keys may nest";
  EXPECT_DECODE_ERROR(edit_field(f, "future", nested(17)), ErrorCode::kMalformed,
                      "nesting deeper than 16 levels");
  EXPECT_DECODE_ERROR(edit_field(f, "future", nested(100000)), ErrorCode::kMalformed, "nesting deeper");
  const std::string tokens = encode(test::sample_messages()[5]);
  EXPECT_DECODE_ERROR(edit_field(tokens, "ids", nested(3)), ErrorCode::kBadField,
                      "tokens.ids[0]: expected an integer, got an array");
}

// Lengths claimed by headers that the frame cannot hold: no allocation of the
// claimed size, a malformed error naming the claim.
TEST(ProtocolErrors, HugeClaimsInShortFrames) {
  // Build by hand: {"p":"troupe","v":1,"t":"tokens","tag":1,"text":"","ids":<header>}
  auto frame_with = [](const std::string& raw) {
    msgpack::sbuffer buf;
    Packer p(buf);
    test::pack_header(p, "tokens", 3);
    p.pack(std::string("tag"));
    p.pack(1);
    p.pack(std::string("text"));
    p.pack(std::string(""));
    p.pack(std::string("ids"));
    return std::string(buf.data(), buf.size()) + raw;
  };
  EXPECT_DECODE_ERROR(frame_with(std::string("\xdd\xff\xff\xff\xff", 5)), ErrorCode::kMalformed,
                      "claims 4294967295 elements but only 0 bytes follow");
  EXPECT_DECODE_ERROR(frame_with(std::string("\xdf\xff\xff\xff\xff\x01", 6)), ErrorCode::kMalformed,
                      "claims 4294967295 elements but only 1 bytes follow");
  EXPECT_DECODE_ERROR(frame_with(std::string("\xdb\xff\xff\xff\xff"
                                             "abc",
                                             8)),
                      ErrorCode::kMalformed, "truncated");
  EXPECT_DECODE_ERROR(frame_with(std::string("\xc6\x7f\xff\xff\xff", 5)), ErrorCode::kMalformed, "truncated");
  EXPECT_DECODE_ERROR(frame_with(std::string("\xc9\xff\xff\xff\xff\x01", 6)), ErrorCode::kMalformed,
                      "truncated");
  // The top-level map itself claiming 2^32 - 1 keys.
  EXPECT_DECODE_ERROR(std::string("\xdf\xff\xff\xff\xff\xa1p", 7), ErrorCode::kMalformed,
                      "claims 4294967295");
  // Many keys, each present: more than a frame may have.
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_map(100);
  for (int i = 0; i < 100; ++i) {
    p.pack("k" + std::to_string(i));
    p.pack(i);
  }
  EXPECT_DECODE_ERROR(std::string(buf.data(), buf.size()), ErrorCode::kMalformed,
                      "a map with 100 keys (at most 64)");
}

TEST(ProtocolErrors, DuplicateKeysAreMalformed) {
  std::string f = submit_frame();
  // Append a second "tag" and bump the map's count (a map16: the frame has 16-255 keys).
  ASSERT_EQ(static_cast<uint8_t>(f[0]), 0xde);
  ASSERT_EQ(f[1], 0);
  ASSERT_LT(static_cast<uint8_t>(f[2]), 0xff);
  f[2] = static_cast<char>(f[2] + 1);
  f += std::string("\xa3tag\x05");
  EXPECT_DECODE_ERROR(f, ErrorCode::kMalformed, "duplicate key \"tag\"");
}

TEST(ProtocolErrors, TypeAndTagAreRecoveredForTheReply) {
  const std::string f = submit_frame();
  DecodeError e = decode_error(edit_field(f, "top_k", [](Packer& p) { p.pack(std::string("many")); }));
  EXPECT_EQ(e.type, "submit");
  EXPECT_EQ(e.tag, std::optional<uint64_t>(42));
  Error reply = error_reply(e);
  EXPECT_EQ(reply.tag, std::optional<uint64_t>(42));
  EXPECT_EQ(reply.code, ErrorCode::kBadField);
  // Strings quoted from the peer are cut and made printable.
  DecodeError t = decode_error(edit_field(f, "t", [](Packer& p) { p.pack(std::string(200, '\x01')); }));
  EXPECT_EQ(t.type, std::string(64, '?') + "...");
}

}  // namespace
}  // namespace troupe::transport

namespace troupe::transport {
namespace {

// A submit's fields are bounded while it is read (SubmitLimits): the count or
// size past a bound is refused, naming the field and keeping the tag, before
// the elements are read or stored — a million empty stop strings cost a
// glance at the array's header, not a million strings.
TEST(ProtocolErrors, SubmitFieldsPastTheirBoundsAreRefusedAsTheyAreRead) {
  auto refused = [](const Submit& s, const SubmitLimits& limits, const std::string& words) {
    Decoded d = decode(encode(s), kDefaultMaxFrameBytes, limits);
    ASSERT_FALSE(d.ok()) << words;
    EXPECT_EQ(d.error.code, ErrorCode::kBadField) << d.error.message;
    EXPECT_EQ(d.error.tag, std::optional<uint64_t>(7)) << d.error.message;
    EXPECT_NE(d.error.message.find(words), std::string::npos) << d.error.message;
  };
  Submit base;
  base.tag = 7;
  base.prompt = "hello";
  SubmitLimits limits;  // 16 stops of 1024 bytes, 1024 biases
  limits.max_prompt_bytes = 100;
  limits.max_prompt_ids = 64;

  Submit many = base;
  many.stop.assign(1'000'000, "");
  refused(many, limits, "submit.stop: at most 16 stop strings, got 1000000");
  Submit long_stop = base;
  long_stop.stop = {"ok", std::string(1025, 'x')};
  refused(long_stop, limits, "submit.stop[1]: a stop string of 1025 bytes; at most 1024");
  Submit prompt = base;
  prompt.prompt = std::string(101, 'p');
  refused(prompt, limits, "submit.prompt: a prompt of 101 bytes; at most 100");
  Submit ids = base;
  ids.prompt.reset();
  ids.prompt_ids = std::vector<int32_t>(65, 1);
  refused(ids, limits, "submit.prompt_ids: at most 64 prompt ids");
  Submit bias = base;
  for (int32_t i = 0; i < 1025; ++i) bias.logit_bias.emplace_back(i, 1.0f);
  refused(bias, limits, "submit.logit_bias: at most 1024 logit_bias entries, got 1025");

  // At the bounds: read.
  Submit fits = base;
  fits.stop.assign(16, std::string(1024, 's'));
  fits.prompt = std::string(100, 'p');
  for (int32_t i = 0; i < 1024; ++i) fits.logit_bias.emplace_back(i, 1.0f);
  Decoded d = decode(encode(fits), kDefaultMaxFrameBytes, limits);
  ASSERT_TRUE(d.ok()) << d.error.message;
  EXPECT_EQ(std::get<Submit>(*d.message).stop.size(), 16u);
}

}  // namespace
}  // namespace troupe::transport
