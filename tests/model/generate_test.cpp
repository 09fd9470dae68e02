#include "model/generate.hpp"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/gpt2.hpp"
#include "model/text/tokenizer.hpp"
#include "model/weights.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

struct Tiny {
  Gpt2Config cfg = Gpt2Config::preset("tiny");
  Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  std::unique_ptr<Gpt2> model;
  explicit Tiny(uint64_t seed = 1234) { model = std::make_unique<Gpt2>(cfg, Gpt2Weights::random(cfg, seed), torch::kCPU); }
};

const Tiny& tiny() {
  static Tiny t;
  return t;
}

GenerateOptions greedy(int32_t max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0.0f;
  o.ignore_eos = true;
  return o;
}

// A model whose last LayerNorm ignores its input, so every step sees the same
// logits: EOS gets about `eos_share` of the probability at temperature 1.
std::unique_ptr<Gpt2> eos_prone_model(const Gpt2Config& cfg) {
  Gpt2Weights w = Gpt2Weights::random(cfg, 99);
  w.ln_f_weight.zero_();
  w.ln_f_bias.fill_(1.5f);
  w.wte[cfg.eos_token_id].fill_(0.1f);  // logit(EOS) = 1.5 * 0.1 * 64 = 9.6, the rest ~ N(0, 0.24)
  return std::make_unique<Gpt2>(cfg, w, torch::kCPU);
}

TEST(Generate, NaiveAndKvGiveTheSameGreedyTokensAndLogits) {
  const auto& t = tiny();
  for (const std::string prompt : {"Hello", "The quick brown fox jumps over", "a b c d e f g h i j k l m n o p"}) {
    const auto ids = t.tok.encode(prompt);
    std::vector<torch::Tensor> naive_logits, kv_logits;
    const auto naive = generate(*t.model, t.tok, ids, greedy(24), GenerateMode::kNaive, {}, &naive_logits);
    const auto kv = generate(*t.model, t.tok, ids, greedy(24), GenerateMode::kKv, {}, &kv_logits);
    ASSERT_EQ(naive.ids.size(), 24u) << prompt;
    EXPECT_EQ(naive.ids, kv.ids) << prompt;
    EXPECT_EQ(naive.text, kv.text);
    EXPECT_EQ(naive.finish_reason, "length");
    EXPECT_EQ(naive.prompt_ids, ids);
    ASSERT_EQ(naive_logits.size(), 24u);
    ASSERT_EQ(kv_logits.size(), 24u);
    for (size_t i = 0; i < naive_logits.size(); ++i) {
      ASSERT_EQ(naive_logits[i].sizes(), torch::IntArrayRef({t.cfg.vocab_size}));
      EXPECT_LT((naive_logits[i] - kv_logits[i]).abs().max().item<float>(), 1e-4f) << prompt << " step " << i;
      EXPECT_EQ(naive_logits[i].argmax().item<int64_t>(), naive.ids[i]);
    }
    EXPECT_EQ(naive.text, t.tok.decode(naive.ids));
    EXPECT_GE(kv.prefill_ms, 0.0);
    EXPECT_GT(kv.decode_ms, 0.0);
  }
}

TEST(Generate, SeededSamplingIsTheSameInBothModes) {
  const auto& t = tiny();
  const auto ids = t.tok.encode("Once upon a time");
  GenerateOptions o = greedy(20);
  o.sampling.temperature = 1.0f;
  o.sampling.top_p = 0.95f;
  o.sampling.seed = 5;
  o.sampling.logprobs = 2;
  const auto naive = generate(*t.model, t.tok, ids, o, GenerateMode::kNaive);
  const auto kv = generate(*t.model, t.tok, ids, o, GenerateMode::kKv);
  EXPECT_EQ(naive.ids, kv.ids);
  ASSERT_EQ(kv.logprobs.size(), kv.ids.size());
  for (size_t i = 0; i < kv.ids.size(); ++i) {
    EXPECT_EQ(kv.logprobs[i].id, kv.ids[i]);
    EXPECT_NEAR(kv.logprobs[i].logprob, naive.logprobs[i].logprob, 1e-4);
    EXPECT_EQ(kv.logprobs[i].top.size(), 2u);
  }
  o.sampling.seed = 6;
  const auto other = generate(*t.model, t.tok, ids, o, GenerateMode::kKv);
  EXPECT_NE(other.ids, kv.ids);
  // Greedy differs from sampling on a random model's flat distribution.
  EXPECT_NE(generate(*t.model, t.tok, ids, greedy(20), GenerateMode::kKv).ids, kv.ids);
  o.sampling.logprobs = -1;
  EXPECT_TRUE(generate(*t.model, t.tok, ids, o, GenerateMode::kKv).logprobs.empty());
}

TEST(Generate, StreamedTextEqualsTheResult) {
  const auto& t = tiny();
  const auto ids = t.tok.encode("Streaming, with UTF-8: caf\xC3\xA9");
  for (auto mode : {GenerateMode::kNaive, GenerateMode::kKv}) {
    std::string streamed;
    int calls = 0;
    const auto r = generate(*t.model, t.tok, ids, greedy(30), mode, [&](const std::string& d) {
      EXPECT_FALSE(d.empty());
      streamed += d;
      ++calls;
    });
    EXPECT_EQ(streamed, r.text);
    EXPECT_EQ(r.text, t.tok.decode(r.ids));
    EXPECT_GT(calls, 5);
  }
}

TEST(Generate, StopStringCutsTheTextAndEndsTheRun) {
  const auto& t = tiny();
  const auto ids = t.tok.encode("The stop string test");
  const auto full = generate(*t.model, t.tok, ids, greedy(40), GenerateMode::kKv);
  // A stop string taken from the middle of what the model writes anyway.
  const std::string piece = t.tok.decode({full.ids[20], full.ids[21]});
  ASSERT_FALSE(piece.empty());
  const size_t cut = full.text.find(piece);
  ASSERT_NE(cut, std::string::npos);
  for (auto mode : {GenerateMode::kNaive, GenerateMode::kKv}) {
    GenerateOptions o = greedy(40);
    o.stop = {piece, "\x01never\x02"};
    std::string streamed;
    const auto r = generate(*t.model, t.tok, ids, o, mode, [&](const std::string& d) { streamed += d; });
    EXPECT_EQ(r.finish_reason, "stop");
    EXPECT_EQ(r.text, full.text.substr(0, cut));
    EXPECT_EQ(streamed, r.text);
    ASSERT_LE(r.ids.size(), 22u);
    EXPECT_TRUE(std::equal(r.ids.begin(), r.ids.end(), full.ids.begin()));
    // The last id is the one that completed the stop string.
    EXPECT_NE(t.tok.decode(r.ids).find(piece), std::string::npos);
    EXPECT_EQ(t.tok.decode({r.ids.begin(), r.ids.end() - 1}).find(piece), std::string::npos);
  }
}

TEST(Generate, EosEndsTheRunUnlessIgnored) {
  const auto& t = tiny();
  const auto model = eos_prone_model(t.cfg);
  const auto ids = t.tok.encode("Until the end");
  // Greedy: EOS at once.
  GenerateOptions o = greedy(10);
  o.ignore_eos = false;
  auto r = generate(*model, t.tok, ids, o, GenerateMode::kKv);
  EXPECT_EQ(r.finish_reason, "eos");
  EXPECT_EQ(r.ids, std::vector<int32_t>{t.cfg.eos_token_id});
  EXPECT_EQ(r.text, "");
  o.ignore_eos = true;
  r = generate(*model, t.tok, ids, o, GenerateMode::kKv);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.ids.size(), 10u);
  EXPECT_EQ(r.text, t.tok.decode(r.ids));  // EOS is ordinary text then
  // Sampling: find a seed whose first EOS comes after a few other tokens.
  o.ignore_eos = false;
  o.max_tokens = 12;
  o.sampling.temperature = 1.0f;
  bool found = false;
  for (uint64_t seed = 0; seed < 100 && !found; ++seed) {
    o.sampling.seed = seed;
    const auto kv = generate(*model, t.tok, ids, o, GenerateMode::kKv);
    if (kv.finish_reason != "eos" || kv.ids.size() < 3) continue;
    found = true;
    const auto naive = generate(*model, t.tok, ids, o, GenerateMode::kNaive);
    EXPECT_EQ(naive.ids, kv.ids);
    EXPECT_EQ(kv.ids.back(), t.cfg.eos_token_id);
    for (size_t i = 0; i + 1 < kv.ids.size(); ++i) EXPECT_NE(kv.ids[i], t.cfg.eos_token_id);
    EXPECT_EQ(kv.text, t.tok.decode({kv.ids.begin(), kv.ids.end() - 1}));
    EXPECT_EQ(naive.text, kv.text);
  }
  EXPECT_TRUE(found);
}

TEST(Generate, ImpossibleRequestsAreRejectedWithTheNumbers) {
  const auto& t = tiny();
  const std::vector<int32_t> prompt(100, 464);
  auto message = [&](const std::vector<int32_t>& p, GenerateOptions o) -> std::string {
    try {
      generate(*t.model, t.tok, p, o, GenerateMode::kKv);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  std::string m = message(prompt, greedy(29));
  EXPECT_NE(m.find("100"), std::string::npos) << m;
  EXPECT_NE(m.find("29"), std::string::npos) << m;
  EXPECT_NE(m.find("128"), std::string::npos) << m;
  EXPECT_EQ(message(prompt, greedy(28)), "no exception");  // exactly n_positions
  EXPECT_NE(message({}, greedy(4)).find("empty"), std::string::npos);
  EXPECT_NE(message({464}, greedy(0)).find("max_tokens"), std::string::npos);
  EXPECT_NE(message({464, 50257}, greedy(4)).find("50257"), std::string::npos);
  GenerateOptions o = greedy(4);
  o.stop = {""};
  EXPECT_NE(message({464}, o), "no exception");
  o = greedy(4);
  o.sampling.top_p = 0.0f;
  EXPECT_NE(message({464}, o).find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace troupe::model
