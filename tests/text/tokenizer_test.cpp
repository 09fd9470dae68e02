// Tokenizer: GPT-2 byte-level BPE against ids known from GPT-2's vocabulary,
// round trips over tricky text, ill-formed UTF-8, streaming decode.
#include "model/text/tokenizer.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/text/pretokenizer.hpp"
#include "model/text/utf8.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

using Ids = std::vector<int32_t>;
const std::string kFffd = "\xEF\xBF\xBD";

const Tokenizer& gpt2() {
  static const Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  return tok;
}

// The id of the token whose raw bytes are `bytes` (GPT-2's ids are dense).
int32_t id_of(const std::string& bytes) {
  for (int32_t id = 0; id < gpt2().vocab_size(); ++id)
    if (gpt2().token_bytes(id) == bytes) return id;
  return -1;
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : gpt2_pretokenize(text)) out.emplace_back(p);
  return out;
}

TEST(Tokenizer, KnownIds) {
  const Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eos_id(), 50256);
  EXPECT_EQ(tok.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok.encode(" Hello"), (Ids{18435}));
  EXPECT_EQ(tok.encode("hello"), (Ids{31373}));
  EXPECT_EQ(tok.encode("hello world"), (Ids{31373, 995}));
  EXPECT_EQ(tok.encode("Hello, world!"), (Ids{15496, 11, 995, 0}));
  EXPECT_EQ(tok.encode(" the"), (Ids{262}));
  EXPECT_EQ(tok.encode("The quick brown fox jumps over the lazy dog."),
            (Ids{464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}));
  EXPECT_EQ(tok.encode(""), Ids{});
}

TEST(Tokenizer, KnownIdsMatchTheirTokens) {
  const Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.token_bytes(15496), "Hello");
  EXPECT_EQ(tok.token_bytes(995), " world");
  EXPECT_EQ(tok.token_bytes(262), " the");
  EXPECT_EQ(tok.token_bytes(220), " ");
  EXPECT_EQ(tok.token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(id_of(" the"), 262);
  EXPECT_EQ(id_of("'m"), 1101);
  EXPECT_EQ(id_of("'ll"), 1183);
  EXPECT_EQ(id_of("\n"), 198);
}

TEST(Tokenizer, EndOfTextInTextIsTheSpecialId) {
  const Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.encode("<|endoftext|>"), (Ids{50256}));
  EXPECT_EQ(tok.encode("a<|endoftext|>b"), (Ids{64, 50256, 65}));
  EXPECT_EQ(tok.encode("<|endoftext|><|endoftext|>"), (Ids{50256, 50256}));
  // Not the whole marker: ordinary BPE.
  EXPECT_EQ(tok.encode("<|endoftext"), (Ids{27, 91, 437, 1659, 5239}));
  EXPECT_EQ(tok.decode({64, 50256, 65}), "a<|endoftext|>b");
}

TEST(Tokenizer, WhitespaceRunsLeaveOneSpaceForTheNextWord) {
  EXPECT_EQ(pieces("a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  EXPECT_EQ(gpt2().encode("a   b"), (Ids{64, 220, 220, 275}));
  EXPECT_EQ(pieces("a\n\n b"), (std::vector<std::string>{"a", "\n\n", " b"}));
  EXPECT_EQ(pieces("hi  "), (std::vector<std::string>{"hi", "  "}));
  EXPECT_EQ(pieces("\t\tfoo"), (std::vector<std::string>{"\t", "\t", "foo"}));
  EXPECT_EQ(pieces("  hello  world  "), (std::vector<std::string>{" ", " hello", " ", " world", "  "}));
}

TEST(Tokenizer, ContractionsAreCaseSensitiveAndAsciiOnly) {
  EXPECT_EQ(pieces("I'm they'll DON'T"),
            (std::vector<std::string>{"I", "'m", " they", "'ll", " DON", "'", "T"}));
  EXPECT_EQ(gpt2().encode("I'm they'll DON'T"), (Ids{40, 1101, 484, 1183, 23917, 6, 51}));
  EXPECT_EQ(pieces("she\xE2\x80\x99s"), (std::vector<std::string>{"she", "\xE2\x80\x99", "s"}));
}

TEST(Tokenizer, UnicodeClassesFollowPythonRegex) {
  EXPECT_EQ(pieces("3.14 12345"), (std::vector<std::string>{"3", ".", "14", " 12345"}));
  // U+180E is not White_Space (PCRE2's \s says it is; GPT-2's tokenizers don't).
  EXPECT_EQ(pieces("x\xE1\xA0\x8E y"), (std::vector<std::string>{"x", "\xE1\xA0\x8E", " y"}));
  // U+0085 is White_Space.
  EXPECT_EQ(pieces(" \xC2\x85\xC2\x85x"), (std::vector<std::string>{" \xC2\x85", "\xC2\x85", "x"}));
  // U+31350 (CJK Extension H, Unicode 15) and U+323B0 (Extension J, Unicode 17) are letters.
  EXPECT_EQ(pieces("a\xF0\xB1\x8D\x90"), (std::vector<std::string>{"a\xF0\xB1\x8D\x90"}));
  EXPECT_EQ(pieces("a\xF0\xB2\x8E\xB0'd"), (std::vector<std::string>{"a\xF0\xB2\x8E\xB0", "'d"}));
  // A combining accent is not a letter: "e" + U+0301 are two pieces.
  EXPECT_EQ(pieces("e\xCC\x81"), (std::vector<std::string>{"e", "\xCC\x81"}));
}

TEST(Tokenizer, RoundTripsTrickyText) {
  const Tokenizer& tok = gpt2();
  const std::vector<std::string> texts = {
      "",
      " ",
      "a   b",
      "\n\n\n",
      "\t \t\n \r\n",
      "trailing   ",
      "   leading",
      "I'm they'll DON'T we've you'd 'sup",
      "3.14159 -42 1,000,000 \xD9\xA3 \xC2\xBD",
      "caf\xC3\xA9 cafe\xCC\x81",                                       // precomposed and combining
      "\xE4\xB8\xAD\xE6\x96\x87 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",  // CJK
      "\xF0\x9F\x98\x80 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",              // emoji, skin tone
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",  // ZWJ family
      "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",  // flag (regional indicators)
      std::string("nul\0byte", 8),
      "\xF4\x8F\xBF\xBF \xEE\x80\x80",  // U+10FFFF, private use
      "<|endoftext|>between<|endoftext|>",
  };
  for (const std::string& text : texts) {
    const Ids ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text) << text;
    for (int32_t id : ids) EXPECT_TRUE(tok.valid_id(id));
  }
}

// 100 000 bytes without a space are one pre-token each; they must encode
// (BPE over long words) and round-trip. How fast is bench_generate's business:
// no wall-clock bound here.
TEST(Tokenizer, LongInputWithoutSpacesRoundTrips) {
  const Tokenizer& tok = gpt2();
  std::mt19937 rng(7);
  std::string random_letters;
  for (int i = 0; i < 100000; ++i) random_letters.push_back(static_cast<char>('a' + rng() % 26));
  for (const std::string& text :
       {std::string(100000, 'a'), random_letters, std::string(100000, '7'), std::string(100000, '!')}) {
    const Ids ids = tok.encode(text);
    EXPECT_LT(ids.size(), text.size());
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST(Tokenizer, IllFormedUtf8IsRejectedWithItsOffset) {
  const Tokenizer& tok = gpt2();
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"abc\x80", 3},           // lone continuation byte
      {"x\xC0\xAF", 1},         // overlong '/'
      {"\xE0\x80\xAF", 0},      // overlong, 3 bytes
      {"ok \xED\xA0\x80", 3},   // UTF-8-encoded surrogate U+D800
      {"ab\xE2\x82", 2},        // truncated euro sign
      {"\xF4\x90\x80\x80", 0},  // above U+10FFFF
      {"\xF0\x9F\x98 x", 0},    // truncated emoji followed by text
      {"z\xFF", 1},
  };
  for (const auto& [text, offset] : bad) {
    try {
      tok.encode(text);
      ADD_FAILURE() << "accepted ill-formed UTF-8 at " << offset;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("byte offset " + std::to_string(offset) + " "), std::string::npos)
          << e.what();
    }
  }
}

TEST(Tokenizer, DecodeReplacesIllFormedBytes) {
  const Tokenizer& tok = gpt2();
  const int32_t e2 = id_of("\xE2"), a = id_of("A"), x82 = id_of("\x82");
  ASSERT_GE(e2, 0);
  EXPECT_EQ(tok.decode({e2}), kFffd);
  EXPECT_EQ(tok.decode({e2, a}), kFffd + "A");
  EXPECT_EQ(tok.decode({e2, x82, id_of("\xAC")}), "\xE2\x82\xAC");
  // One U+FFFD per maximal ill-formed subpart, as Python's errors="replace".
  EXPECT_EQ(tok.decode({id_of("\xED"), id_of("\xA0"), x82}), kFffd + kFffd + kFffd);
  EXPECT_EQ(tok.decode({e2, x82}), kFffd);
  EXPECT_THROW(tok.decode({50257}), std::invalid_argument);
  EXPECT_THROW(tok.decode({-1}), std::invalid_argument);
  EXPECT_FALSE(tok.valid_id(50257));
  EXPECT_TRUE(tok.valid_id(0));
}

TEST(IncrementalDecoder, NeverEmitsPartialCharactersAndMatchesDecode) {
  const Tokenizer& tok = gpt2();
  const std::string text =
      "Family \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7, flag "
      "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7, \xE4\xB8\xAD\xE6\x96\x87 caf\xC3\xA9 \xF0\x9F\x98\x80!";
  const Ids ids = tok.encode(text);
  IncrementalDecoder dec(tok);
  std::string streamed;
  int held = 0;  // pushes that returned nothing: a character was split across tokens
  for (int32_t id : ids) {
    const std::string part = dec.push(id);
    EXPECT_EQ(utf8::find_invalid(part), std::string::npos);
    EXPECT_EQ(part.find(kFffd), std::string::npos);
    if (part.empty()) ++held;
    streamed += part;
  }
  streamed += dec.flush();
  EXPECT_GT(held, 0);
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(streamed, tok.decode(ids));
}

TEST(IncrementalDecoder, InvalidBytesBecomeReplacementOnceDecided) {
  const Tokenizer& tok = gpt2();
  IncrementalDecoder dec(tok);
  EXPECT_EQ(dec.push(id_of("\xE2")), "");
  EXPECT_EQ(dec.push(id_of("\x82")), "");
  EXPECT_EQ(dec.push(id_of("A")), kFffd + "A");
  EXPECT_EQ(dec.push(id_of("\xF0")), "");
  EXPECT_EQ(dec.flush(), kFffd);
  EXPECT_EQ(dec.flush(), "");
  EXPECT_THROW(dec.push(50257), std::invalid_argument);
}

TEST(IncrementalDecoder, RandomIdStreamsMatchDecode) {
  const Tokenizer& tok = gpt2();
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    Ids ids;
    for (int i = 0; i < 12; ++i) ids.push_back(static_cast<int32_t>(rng() % tok.vocab_size()));
    IncrementalDecoder dec(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string part = dec.push(id);
      EXPECT_EQ(utf8::find_invalid(part), std::string::npos);
      streamed += part;
    }
    streamed += dec.flush();
    EXPECT_EQ(streamed, tok.decode(ids));
  }
}

// Every sampled id decodes from its bytes, and a token that is a whole
// pre-token of its own encodes back to itself.
TEST(Tokenizer, VocabularySampleRoundTrips) {
  const Tokenizer& tok = gpt2();
  int whole = 0;
  for (int32_t id = 0; id < tok.vocab_size(); id += 7) {
    const std::string bytes = tok.token_bytes(id);
    ASSERT_FALSE(bytes.empty()) << id;
    std::string expected;
    utf8::decode_replace(bytes, /*final=*/true, expected);
    EXPECT_EQ(tok.decode({id}), expected) << id;
    if (utf8::find_invalid(bytes) != std::string::npos) continue;
    const auto p = gpt2_pretokenize(bytes);
    if (p.size() != 1 && id != tok.eos_id()) continue;
    ++whole;
    EXPECT_EQ(tok.encode(bytes), (Ids{id})) << id << " \"" << bytes << "\"";
  }
  EXPECT_GT(whole, 5000);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const Tokenizer tok = gpt2();  // a copy shares the vocabulary
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back("Item " + std::to_string(i * 7919) + ": the caf\xC3\xA9 said it's " +
                    std::string(i % 5 + 1, ' ') + "w" + std::to_string(i) + "rd\n");
  std::vector<Ids> expected;
  for (const auto& t : texts) expected.push_back(gpt2().encode(t));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (size_t i = 0; i < texts.size(); ++i)
          if (tok.encode(texts[(i + t * 31) % texts.size()]) != expected[(i + t * 31) % texts.size()])
            ++mismatches[t];
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(Tokenizer, EmptyTokenizerRefusesWork) {
  const Tokenizer tok;
  EXPECT_TRUE(tok.empty());
  EXPECT_EQ(tok.vocab_size(), 0);
  EXPECT_FALSE(tok.valid_id(0));
  EXPECT_THROW(tok.encode("x"), std::logic_error);
  EXPECT_THROW(tok.decode({0}), std::logic_error);
  EXPECT_THROW(tok.eos_id(), std::logic_error);
}

TEST(Tokenizer, BrokenFilesAreReported) {
  test::TempDir dir;
  EXPECT_THROW(Tokenizer::from_dir(dir.path()), std::runtime_error);
  const std::string vocab = test::tokenizer_dir() + "/vocab.json";
  auto write = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir.file(name)) << body;
    return dir.file(name);
  };
  EXPECT_THROW(Tokenizer::from_files(vocab, write("bad.txt", "#version: 0.2\nonlyone\n")),
               std::runtime_error);
  // "ĠĠ" (two spaces) is not in GPT-2's vocabulary.
  EXPECT_THROW(Tokenizer::from_files(vocab, write("missing.txt", "#version: 0.2\n\xC4\xA0 \xC4\xA0\n")),
               std::runtime_error);
  EXPECT_THROW(Tokenizer::from_files(write("v.json", "{\"a\": 0"), write("m.txt", "")), std::runtime_error);
  // Without merges every byte is its own token.
  const Tokenizer bytes_only = Tokenizer::from_files(vocab, write("empty.txt", "#version: 0.2\n"));
  EXPECT_EQ(bytes_only.encode("hi"), (Ids{id_of("h"), id_of("i")}));
}

}  // namespace
}  // namespace troupe::model
