#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <stdexcept>

#include <torch/types.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "model/safetensors.hpp"
#include "model/weights.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

Gpt2Config small_config() {
  Gpt2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.n_positions = 16;
  c.vocab_size = 10;
  c.eos_token_id = 9;
  return c;
}

std::string load_error(const std::string& path, const Gpt2Config& c) {
  try {
    Gpt2Weights::load(path, c);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

void expect_same(const Gpt2Weights& a, const Gpt2Weights& b) {
  const auto na = a.named();
  const auto nb = b.named();
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(na[i].first, nb[i].first);
    EXPECT_TRUE(torch::equal(na[i].second, nb[i].second)) << na[i].first;
  }
}

TEST(Weights, NamedIsHfLayoutInStableOrder) {
  const Gpt2Config c = small_config();
  const auto named = Gpt2Weights::random(c, 1).named();
  ASSERT_EQ(named.size(), 4u + 12u * c.n_layer);
  EXPECT_EQ(named.front().first, "wte.weight");
  EXPECT_EQ(named[1].first, "wpe.weight");
  EXPECT_EQ(named[2].first, "h.0.ln_1.weight");
  EXPECT_EQ(named[4].first, "h.0.attn.c_attn.weight");
  EXPECT_EQ(named[4].second.sizes(), (std::vector<int64_t>{8, 24}));  // Conv1D [in, out]
  EXPECT_EQ(named[12].first, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(named[12].second.sizes(), (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(named[14].first, "h.1.ln_1.weight");
  EXPECT_EQ(named.back().first, "ln_f.bias");
  for (const auto& [name, t] : named) {
    EXPECT_EQ(t.scalar_type(), torch::kFloat32) << name;
    EXPECT_TRUE(t.device().is_cpu()) << name;
    EXPECT_TRUE(t.is_contiguous()) << name;
  }
}

TEST(Weights, RandomFollowsGpt2Init) {
  Gpt2Config c = Gpt2Config::preset("tiny");
  const Gpt2Weights w = Gpt2Weights::random(c, 7);
  EXPECT_EQ(w.wte.sizes(), (std::vector<int64_t>{50257, 64}));
  EXPECT_EQ(w.wpe.sizes(), (std::vector<int64_t>{128, 64}));
  EXPECT_NEAR(w.wte.mean().item<double>(), 0.0, 1e-4);
  EXPECT_NEAR(w.wte.std().item<double>(), 0.02, 2e-4);
  const double proj = 0.02 / std::sqrt(4.0);
  const auto& l = w.layers[1];
  EXPECT_NEAR(l.mlp_c_proj_weight.std().item<double>(), proj, proj * 0.03);
  EXPECT_NEAR(l.attn_c_proj_weight.std().item<double>(), proj, proj * 0.05);
  EXPECT_NEAR(l.attn_c_attn_weight.std().item<double>(), 0.02, 0.02 * 0.03);
  EXPECT_TRUE(torch::equal(l.ln_1_weight, torch::ones({64})));
  EXPECT_TRUE(torch::equal(l.ln_2_bias, torch::zeros({64})));
  EXPECT_TRUE(torch::equal(l.attn_c_attn_bias, torch::zeros({192})));
  EXPECT_TRUE(torch::equal(w.ln_f_weight, torch::ones({64})));
  // Tensors are not copies of one another.
  EXPECT_FALSE(torch::equal(w.layers[0].attn_c_attn_weight, w.layers[1].attn_c_attn_weight));
}

TEST(Weights, RandomIsDeterministicPerSeed) {
  const Gpt2Config c = Gpt2Config::preset("tiny");
  const Gpt2Weights a = Gpt2Weights::random(c, 1234);
  expect_same(a, Gpt2Weights::random(c, 1234));
  const Gpt2Weights b = Gpt2Weights::random(c, 1235);
  EXPECT_FALSE(torch::equal(a.wte, b.wte));
  EXPECT_FALSE(torch::equal(a.layers[0].mlp_c_fc_weight, b.layers[0].mlp_c_fc_weight));
  // Pinned values: the stream is our own (SplitMix64 + Box-Muller), so these
  // hold on every machine and thread count; a change here changes every
  // random model on disk.
  EXPECT_FLOAT_EQ(a.wte[0][0].item<float>(), -0.0026236334815621376f);
  EXPECT_FLOAT_EQ(a.wte[50256][63].item<float>(), 0.0017239684239029884f);
  EXPECT_FLOAT_EQ(a.layers[1].mlp_c_proj_weight[255][63].item<float>(), -0.002865217160433531f);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Gpt2Weights one_thread = Gpt2Weights::random(c, 1234);
  at::set_num_threads(threads);
  expect_same(a, one_thread);
}

TEST(Weights, FingerprintNamesTheModel) {
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  const Gpt2Weights a = Gpt2Weights::random(cfg, 1), b = Gpt2Weights::random(cfg, 1), c = Gpt2Weights::random(cfg, 2);
  EXPECT_EQ(fingerprint(cfg, a), fingerprint(cfg, b)) << "equal weights, equal name";
  EXPECT_NE(fingerprint(cfg, a), fingerprint(cfg, c));
  Gpt2Weights d = Gpt2Weights::random(cfg, 1);
  d.layers.back().mlp_c_proj_bias[3] += 1e-6f;  // one float in the last layer
  EXPECT_NE(fingerprint(cfg, a), fingerprint(cfg, d));
  Gpt2Config eps = cfg;
  eps.layer_norm_epsilon = 1e-6;
  EXPECT_NE(fingerprint(cfg, a), fingerprint(eps, a));
}

// fingerprint hashes each weight in pieces of 4 MiB: a wte of several pieces
// loaded from its file names the model as the same weights on the heap do,
// and one float changed in a later piece changes the name.
TEST(Weights, FingerprintOfAWeightInPiecesFromItsFile) {
  test::TempDir dir;
  Gpt2Config c = small_config();
  c.vocab_size = 3 * (1 << 20) / c.n_embd + 7;  // wte: 12 MiB and a bit, four pieces
  const Gpt2Weights w = Gpt2Weights::random(c, 5);
  write_safetensors(dir.file("m.safetensors"), w.named());
  const Gpt2Weights loaded = Gpt2Weights::load(dir.file("m.safetensors"), c);
  EXPECT_EQ(fingerprint(c, loaded), fingerprint(c, w));
  expect_same(w, loaded);  // and still reads the same after its pages were let go
  Gpt2Weights d = Gpt2Weights::random(c, 5);
  d.wte[c.vocab_size - 2][1] += 1e-6f;
  EXPECT_NE(fingerprint(c, d), fingerprint(c, loaded));
}

TEST(Weights, RandomRejectsImpossibleConfig) {
  Gpt2Config c = small_config();
  c.n_head = 3;
  EXPECT_THROW(Gpt2Weights::random(c, 1), std::invalid_argument);
}

TEST(Weights, LoadRoundTripWithAndWithoutPrefix) {
  test::TempDir dir;
  const Gpt2Config c = small_config();
  const Gpt2Weights w = Gpt2Weights::random(c, 3);
  write_safetensors(dir.file("plain.safetensors"), w.named());
  expect_same(w, Gpt2Weights::load(dir.file("plain.safetensors"), c));
  // The matrices are read from the mapped file (SafetensorsFile::map), in pieces when hashed.
  EXPECT_EQ(fingerprint(c, Gpt2Weights::load(dir.file("plain.safetensors"), c)), fingerprint(c, w));

  // GPT2LMHeadModel's names: "transformer." prefix, lm_head.weight, attn.bias buffers.
  std::vector<std::pair<std::string, torch::Tensor>> hf;
  for (const auto& [name, t] : w.named()) hf.emplace_back("transformer." + name, t);
  hf.emplace_back("lm_head.weight", w.wte);
  hf.emplace_back("transformer.h.0.attn.bias", torch::ones({1, 1, 16, 16}));
  write_safetensors(dir.file("hf.safetensors"), hf);
  expect_same(w, Gpt2Weights::load(dir.file("hf.safetensors"), c));
}

// Writes `tensors` as F16 or BF16 by hand (write_safetensors writes F32 only).
void write_half(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                torch::ScalarType type) {
  nlohmann::json header;
  std::string data;
  for (const auto& [name, t] : tensors) {
    const torch::Tensor h = t.to(type).contiguous();
    header[name] = {{"dtype", type == torch::kFloat16 ? "F16" : "BF16"},
                    {"shape", h.sizes().vec()},
                    {"data_offsets", {data.size(), data.size() + h.numel() * 2}}};
    data.append(static_cast<const char*>(h.data_ptr()), h.numel() * 2);
  }
  const std::string text = header.dump();
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(text.size() >> (8 * i));
  std::ofstream(path, std::ios::binary) << len << text << data;
}

// The vectors and wpe load as fp32; the matrices a model packs stay in the
// file's 16-bit dtype (over the mapping) for the model to widen or pack as
// they are; the values are the file's either way.
TEST(Weights, LoadsF16AndBF16) {
  test::TempDir dir;
  const Gpt2Config c = small_config();
  const Gpt2Weights w = Gpt2Weights::random(c, 3);
  for (auto type : {torch::kFloat16, torch::kBFloat16}) {
    write_half(dir.file("m.safetensors"), w.named(), type);
    const Gpt2Weights back = Gpt2Weights::load(dir.file("m.safetensors"), c);
    const auto a = w.named();
    const auto b = back.named();
    for (size_t i = 0; i < a.size(); ++i) {
      const bool packed = a[i].second.dim() == 2 && a[i].first != "wpe.weight";
      EXPECT_EQ(b[i].second.scalar_type(), packed ? type : torch::kFloat32) << a[i].first;
      EXPECT_TRUE(torch::equal(b[i].second.to(torch::kFloat32), a[i].second.to(type).to(torch::kFloat32)))
          << a[i].first;
    }
    EXPECT_EQ(fingerprint(c, back), fingerprint(c, Gpt2Weights::load(dir.file("m.safetensors"), c)));
  }
}

TEST(Weights, LmHeadMustMatchWte) {
  test::TempDir dir;
  const Gpt2Config c = small_config();
  auto named = Gpt2Weights::random(c, 3).named();
  named.emplace_back("lm_head.weight", torch::zeros({10, 4}));
  write_safetensors(dir.file("m.safetensors"), named);
  const std::string e = load_error(dir.file("m.safetensors"), c);
  EXPECT_HAS(e, "lm_head.weight");
  EXPECT_HAS(e, "[10, 4]");
  EXPECT_HAS(e, "[10, 8]");
}

TEST(Weights, MissingTensorIsNamed) {
  test::TempDir dir;
  const Gpt2Config c = small_config();
  auto named = Gpt2Weights::random(c, 3).named();
  for (auto it = named.begin(); it != named.end(); ++it) {
    if (it->first == "h.1.mlp.c_fc.bias") {
      named.erase(it);
      break;
    }
  }
  write_safetensors(dir.file("m.safetensors"), named);
  const std::string e = load_error(dir.file("m.safetensors"), c);
  EXPECT_HAS(e, "h.1.mlp.c_fc.bias");
  EXPECT_HAS(e, "missing");
  EXPECT_HAS(e, "[32]");
  EXPECT_HAS(e, dir.file("m.safetensors"));
}

TEST(Weights, WrongShapeIsNamed) {
  test::TempDir dir;
  const Gpt2Config c = small_config();
  auto named = Gpt2Weights::random(c, 3).named();
  for (auto& [name, t] : named) {
    if (name == "h.0.attn.c_attn.weight") t = t.t().contiguous();  // [3E, E] as nn.Linear would
  }
  write_safetensors(dir.file("m.safetensors"), named);
  const std::string e = load_error(dir.file("m.safetensors"), c);
  EXPECT_HAS(e, "h.0.attn.c_attn.weight");
  EXPECT_HAS(e, "[24, 8]");
  EXPECT_HAS(e, "expected [8, 24]");
}

TEST(Weights, ConfigMismatch) {
  test::TempDir dir;
  Gpt2Config c = small_config();
  write_safetensors(dir.file("m.safetensors"), Gpt2Weights::random(c, 3).named());
  Gpt2Config fewer = c;
  fewer.n_layer = 1;
  EXPECT_HAS(load_error(dir.file("m.safetensors"), fewer), "n_layer");
  Gpt2Config more = c;
  more.n_layer = 3;
  EXPECT_HAS(load_error(dir.file("m.safetensors"), more), "h.2.ln_1.weight");
  Gpt2Config wider = c;
  wider.n_positions = 32;
  EXPECT_HAS(load_error(dir.file("m.safetensors"), wider), "wpe.weight");
}

TEST(Weights, BrokenFileIsReported) {
  test::TempDir dir;
  const Gpt2Config c = small_config();
  write_safetensors(dir.file("m.safetensors"), Gpt2Weights::random(c, 3).named());
  std::filesystem::resize_file(dir.file("m.safetensors"),
                               std::filesystem::file_size(dir.file("m.safetensors")) - 1);
  EXPECT_HAS(load_error(dir.file("m.safetensors"), c), "out of range");
  EXPECT_HAS(load_error(dir.file("none.safetensors"), c), "cannot open");
}

}  // namespace
}  // namespace troupe::model
