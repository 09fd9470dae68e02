#include <gtest/gtest.h>

#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

// GPT-2 124M's config.json as published on huggingface.co/gpt2 (abridged).
const char* kGpt2Json = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "vocab_size": 50257
})";

std::string error_of(const std::string& text) {
  try {
    Gpt2Config::from_json_text(text, "cfg.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

std::string with(const std::string& key, const nlohmann::json& value) {
  auto j = nlohmann::json::parse(kGpt2Json);
  j[key] = value;
  return j.dump();
}

std::string without(const std::string& key) {
  auto j = nlohmann::json::parse(kGpt2Json);
  j.erase(key);
  return j.dump();
}

TEST(Config, ParsesGpt2) {
  const Gpt2Config c = Gpt2Config::from_json_text(kGpt2Json, "cfg.json");
  EXPECT_EQ(c.n_layer, 12);
  EXPECT_EQ(c.n_head, 12);
  EXPECT_EQ(c.n_embd, 768);
  EXPECT_EQ(c.n_positions, 1024);
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_DOUBLE_EQ(c.layer_norm_epsilon, 1e-5);
  EXPECT_EQ(c.eos_token_id, 50256);
  EXPECT_FALSE(c.random_weights);
  EXPECT_EQ(c.head_dim(), 64);
}

TEST(Config, NCtxStandsInForNPositions) {
  const Gpt2Config c = Gpt2Config::from_json_text(without("n_positions"), "cfg.json");
  EXPECT_EQ(c.n_positions, 1024);
}

TEST(Config, OptionalFields) {
  auto j = nlohmann::json::parse(kGpt2Json);
  j.erase("eos_token_id");
  j.erase("model_type");
  j.erase("activation_function");
  j["troupe_random_weights"] = true;
  const Gpt2Config c = Gpt2Config::from_json_text(j.dump(), "cfg.json");
  EXPECT_EQ(c.eos_token_id, 50256);
  EXPECT_TRUE(c.random_weights);
}

TEST(Config, RejectsUnsupportedActivationAndModelType) {
  std::string e = error_of(with("activation_function", "relu"));
  EXPECT_NE(e.find("activation_function"), std::string::npos) << e;
  EXPECT_NE(e.find("relu"), std::string::npos) << e;
  EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  e = error_of(with("model_type", "llama"));
  EXPECT_NE(e.find("model_type"), std::string::npos) << e;
  EXPECT_NE(e.find("llama"), std::string::npos) << e;
}

TEST(Config, MissingFieldNamesFieldAndFile) {
  for (const char* f : {"n_layer", "n_head", "n_embd", "vocab_size", "layer_norm_epsilon"}) {
    const std::string e = error_of(without(f));
    EXPECT_NE(e.find(f), std::string::npos) << e;
    EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  }
  auto j = nlohmann::json::parse(kGpt2Json);
  j.erase("n_positions");
  j.erase("n_ctx");
  const std::string e = error_of(j.dump());
  EXPECT_NE(e.find("n_positions"), std::string::npos) << e;
}

TEST(Config, RejectsBadValues) {
  EXPECT_NE(error_of(with("n_layer", "12")).find("n_layer"), std::string::npos);
  EXPECT_NE(error_of(with("n_head", -1)).find("n_head"), std::string::npos);
  EXPECT_NE(error_of(with("n_head", 7)).find("multiple"), std::string::npos);
  EXPECT_NE(error_of(with("eos_token_id", 50257)).find("eos_token_id"), std::string::npos);
  EXPECT_NE(error_of(with("troupe_random_weights", 1)).find("troupe_random_weights"),
            std::string::npos);
}

TEST(Config, RejectsBadJson) {
  std::string e = error_of("{\"n_layer\": 12,");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  e = error_of("[1, 2]");
  EXPECT_NE(e.find("object"), std::string::npos) << e;
  e = error_of("");
  EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
}

TEST(Config, FileErrorsNameThePath) {
  test::TempDir dir;
  try {
    Gpt2Config::from_json_file(dir.file("nope.json"));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("nope.json")), std::string::npos) << e.what();
  }
  std::ofstream(dir.file("config.json")) << without("n_embd");
  try {
    Gpt2Config::from_json_file(dir.file("config.json"));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("config.json")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("n_embd"), std::string::npos) << e.what();
  }
}

TEST(Config, Presets) {
  const Gpt2Config tiny = Gpt2Config::preset("tiny");
  EXPECT_EQ(tiny.n_layer, 2);
  EXPECT_EQ(tiny.n_head, 2);
  EXPECT_EQ(tiny.n_embd, 64);
  EXPECT_EQ(tiny.n_positions, 128);
  EXPECT_EQ(tiny.vocab_size, 50257);
  const Gpt2Config g = Gpt2Config::preset("gpt2");
  EXPECT_EQ(g.n_layer, 12);
  EXPECT_EQ(g.n_head, 12);
  EXPECT_EQ(g.n_embd, 768);
  EXPECT_EQ(g.n_positions, 1024);
  try {
    Gpt2Config::preset("huge");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tiny"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gpt2"), std::string::npos) << e.what();
  }
}

TEST(Config, ToJsonRoundTripsAndIsHfCompatible) {
  Gpt2Config c = Gpt2Config::preset("tiny");
  c.random_weights = true;
  c.layer_norm_epsilon = 1e-6;
  const std::string text = c.to_json();
  const Gpt2Config back = Gpt2Config::from_json_text(text, "x");
  EXPECT_EQ(back.n_layer, c.n_layer);
  EXPECT_EQ(back.n_head, c.n_head);
  EXPECT_EQ(back.n_embd, c.n_embd);
  EXPECT_EQ(back.n_positions, c.n_positions);
  EXPECT_EQ(back.vocab_size, c.vocab_size);
  EXPECT_DOUBLE_EQ(back.layer_norm_epsilon, 1e-6);
  EXPECT_TRUE(back.random_weights);
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["n_ctx"], 128);
  EXPECT_EQ(j["bos_token_id"], 50256);
  EXPECT_EQ(j["eos_token_id"], 50256);
}

TEST(Config, Validate) {
  Gpt2Config c = Gpt2Config::preset("tiny");
  EXPECT_NO_THROW(c.validate());
  c.n_head = 3;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c = Gpt2Config::preset("tiny");
  c.n_layer = 0;
  EXPECT_THROW(c.validate(), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::model
