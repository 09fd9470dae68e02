#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "model/gpt2.hpp"
#include "model/linear.hpp"
#include "model/model_dir.hpp"
#include "model/safetensors.hpp"
#include "tiny_model.hpp"

namespace troupe::model {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string load_error(const std::string& dir) {
  try {
    testing::internal::CaptureStderr();
    load_model_dir(dir);
    testing::internal::GetCapturedStderr();
  } catch (const std::runtime_error& e) {
    testing::internal::GetCapturedStderr();
    return e.what();
  }
  return "";
}

TEST(ModelDir, RandomModelRoundTrip) {
  test::TempDir dir;
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  write_random_model(dir.path(), cfg, 77, test::tokenizer_dir());
  for (const char* f : {"config.json", "model.safetensors", "vocab.json", "merges.txt"}) {
    EXPECT_TRUE(fs::is_regular_file(dir.file(f))) << f;
  }
  EXPECT_EQ(slurp(dir.file("vocab.json")), slurp(test::tokenizer_dir() + "/vocab.json"));
  EXPECT_EQ(slurp(dir.file("merges.txt")), slurp(test::tokenizer_dir() + "/merges.txt"));
  EXPECT_EQ(nlohmann::json::parse(slurp(dir.file("config.json")))["troupe_random_weights"], true);
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  }

  testing::internal::CaptureStderr();
  const ModelDir m = load_model_dir(dir.path());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_HAS(err, "RANDOM WEIGHTS");
  EXPECT_HAS(err, "troupe download gpt2");
  EXPECT_EQ(m.path, dir.path());
  EXPECT_TRUE(m.config.random_weights);
  EXPECT_EQ(m.config.n_layer, 2);
  EXPECT_EQ(m.config.n_embd, 64);
  EXPECT_EQ(m.tokenizer.vocab_size(), 50257);
  EXPECT_EQ(m.tokenizer.decode(m.tokenizer.encode("Hello world")), "Hello world");
  const Gpt2Weights want = Gpt2Weights::random(cfg, 77);
  const auto a = want.named();
  const auto b = m.weights.named();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
}

TEST(ModelDir, SameSeedSameFiles) {
  test::TempDir a, b;
  write_random_model(a.path(), Gpt2Config::preset("tiny"), 5, test::tokenizer_dir());
  write_random_model(b.path(), Gpt2Config::preset("tiny"), 5, test::tokenizer_dir());
  EXPECT_EQ(slurp(a.file("model.safetensors")), slurp(b.file("model.safetensors")));
  EXPECT_EQ(slurp(a.file("config.json")), slurp(b.file("config.json")));
}

TEST(ModelDir, TrainedModelHasNoBanner) {
  test::TempDir dir;
  write_random_model(dir.path(), Gpt2Config::preset("tiny"), 1, test::tokenizer_dir());
  Gpt2Config c = Gpt2Config::preset("tiny");
  c.random_weights = false;
  std::ofstream(dir.file("config.json"), std::ios::trunc) << c.to_json();
  testing::internal::CaptureStderr();
  const ModelDir m = load_model_dir(dir.path());
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_FALSE(m.config.random_weights);
}

TEST(ModelDir, SharedTinyModelLoads) {
  const std::string dir = test::tiny_model_dir();
  EXPECT_EQ(dir, test::tiny_model_dir());
  testing::internal::CaptureStderr();
  const ModelDir m = load_model_dir(dir);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(m.config.n_positions, 128);
  EXPECT_TRUE(torch::equal(m.weights.wte, Gpt2Weights::random(Gpt2Config::preset("tiny"), 1234).wte));
}

// Models built from one loaded folder: the first ones get copies that share
// the loaded tensors; the last takes them, leaving the folder's weights empty
// (so it frees each source matrix as it packs it).
TEST(ModelDir, TheLastModelTakesTheLoadedWeights) {
  testing::internal::CaptureStderr();  // the random-weights banner
  ModelDir dir = load_model_dir(test::tiny_model_dir());
  testing::internal::GetCapturedStderr();
  ASSERT_TRUE(dir.weights.wte.defined());
  const void* wte = dir.weights.wte.data_ptr();
  const Gpt2Weights copy = weights_for_model(dir, /*last_model=*/false);
  EXPECT_EQ(copy.wte.data_ptr(), wte) << "a copy shares the tensors";
  EXPECT_TRUE(dir.weights.wte.defined());
  EXPECT_EQ(dir.weights.layers.size(), copy.layers.size());
  const Gpt2Weights taken = weights_for_model(dir, /*last_model=*/true);
  EXPECT_EQ(taken.wte.data_ptr(), wte);
  EXPECT_EQ(taken.layers.size(), copy.layers.size());
  EXPECT_FALSE(dir.weights.wte.defined()) << "the folder holds nothing after the last model";
  EXPECT_TRUE(dir.weights.layers.empty());
}

// A process's workers on one device share one model, built from the folder,
// which holds no weights afterwards.
TEST(ModelDir, WorkersOnOneDeviceShareOneModel) {
  testing::internal::CaptureStderr();  // the random-weights banner
  ModelDir dir = load_model_dir(test::tiny_model_dir());
  testing::internal::GetCapturedStderr();
  const auto models = models_per_device(dir, {"cpu", "cpu", "cpu"}, WeightDtype::kFloat32);
  ASSERT_EQ(models.size(), 1u);
  ASSERT_NE(models.at("cpu"), nullptr);
  EXPECT_EQ(models.at("cpu")->config().n_layer, dir.config.n_layer);
  EXPECT_FALSE(dir.weights.wte.defined()) << "the last model took the loaded weights";
}

// troupe convert: a folder whose matrices are BF16 (half the bytes), the
// vectors F32, the metadata kept; loaded with --dtype bfloat16 it is the
// model that the fp32 folder loaded with it is, bit for bit (and, in fp32,
// the fp32 model of the rounded weights); back to float32, F32 again. It
// never overwrites a model, nor writes int8.
TEST(ModelDir, ConvertWritesTheSameBfloat16ModelInHalfTheBytes) {
  test::TempDir dir;
  write_random_model(dir.file("src"), Gpt2Config::preset("tiny"), 5, test::tokenizer_dir());
  testing::internal::CaptureStderr();  // the random-weights banners
  const uint64_t bytes = convert_model(dir.file("src"), dir.file("bf16"), WeightDtype::kBFloat16);
  const uint64_t back = convert_model(dir.file("bf16"), dir.file("f32"), WeightDtype::kFloat32);
  ModelDir src = load_model_dir(dir.file("src"));
  ModelDir bf16 = load_model_dir(dir.file("bf16"));
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(bytes, fs::file_size(dir.file("bf16/model.safetensors")));
  EXPECT_LT(bytes, fs::file_size(dir.file("src/model.safetensors")) * 0.6);
  EXPECT_NEAR(static_cast<double>(back),
              static_cast<double>(fs::file_size(dir.file("src/model.safetensors"))), 256)
      << "F32 again: the source's bytes, and a header with one more metadata key";
  for (const char* f : {"config.json", "vocab.json", "merges.txt"})
    EXPECT_EQ(slurp(dir.file("bf16/") + f), slurp(dir.file("src/") + f)) << f;
  const SafetensorsFile file(dir.file("bf16/model.safetensors"));
  EXPECT_EQ(file.metadata().at("troupe_dtype"), "bfloat16");
  EXPECT_EQ(file.metadata().at("troupe_random_weights"), "true");
  for (const SafetensorsEntry& e : file.entries())
    EXPECT_EQ(e.dtype, e.shape.size() == 2 ? "BF16" : "F32") << e.name;
  const std::vector<int32_t> ids = {5, 17, 300, 2, 99, 7};
  const Gpt2 a(src.config, src.weights, torch::kCPU, WeightDtype::kBFloat16);
  const Gpt2 b(bf16.config, bf16.weights, torch::kCPU, WeightDtype::kBFloat16);
  EXPECT_TRUE(torch::equal(a.forward_full(ids), b.forward_full(ids)));
  Gpt2Weights rounded = src.weights;
  for (auto* m : {&rounded.wte, &rounded.wpe}) *m = round_to_bfloat16(*m);
  for (LayerWeights& l : rounded.layers)
    for (auto* m : {&l.attn_c_attn_weight, &l.attn_c_proj_weight, &l.mlp_c_fc_weight, &l.mlp_c_proj_weight})
      *m = round_to_bfloat16(*m);
  const Gpt2 c(src.config, rounded, torch::kCPU, WeightDtype::kFloat32);
  const Gpt2 d(bf16.config, bf16.weights, torch::kCPU, WeightDtype::kFloat32);
  EXPECT_TRUE(torch::equal(c.forward_full(ids), d.forward_full(ids)));
  for (WeightDtype q : {WeightDtype::kInt8, WeightDtype::kInt8G32}) {  // quantized from the bits as they are
    const Gpt2 e(src.config, rounded, torch::kCPU, q);
    const Gpt2 f(bf16.config, bf16.weights, torch::kCPU, q);
    EXPECT_TRUE(torch::equal(e.forward_full(ids), f.forward_full(ids))) << to_string(q);
  }
  const SafetensorsFile f32(dir.file("f32/model.safetensors"));
  for (const SafetensorsEntry& e : f32.entries()) EXPECT_EQ(e.dtype, "F32") << e.name;
  EXPECT_TRUE(
      torch::equal(f32.to_float("wte.weight"), round_to_bfloat16(src.weights.wte.to(torch::kFloat32))));

  const auto refused = [&](const std::string& from, const std::string& to, WeightDtype t) {
    try {
      convert_model(from, to, t);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  EXPECT_HAS(refused(dir.file("src"), dir.file("bf16"), WeightDtype::kBFloat16), "already holds config.json");
  EXPECT_HAS(refused(dir.file("src"), dir.file("src"), WeightDtype::kBFloat16), "is the model folder itself");
  EXPECT_HAS(refused(dir.file("src"), dir.file("q"), WeightDtype::kInt8), "--quantization int8");
  EXPECT_FALSE(fs::exists(dir.file("q"))) << "a refused conversion writes nothing";
}

TEST(ModelDir, MissingFilesAreNamedWithTheWayOut) {
  test::TempDir dir;
  write_random_model(dir.path(), Gpt2Config::preset("tiny"), 1, test::tokenizer_dir());
  fs::remove(dir.file("model.safetensors"));
  fs::remove(dir.file("merges.txt"));
  const std::string e = load_error(dir.path());
  EXPECT_HAS(e, "lacks model.safetensors, merges.txt ");
  EXPECT_HAS(e, "troupe download gpt2 --to " + dir.path());
  EXPECT_HAS(e, "troupe init-model --out " + dir.path());

  const std::string none = load_error(dir.file("nowhere"));
  EXPECT_HAS(none, "does not exist");
  EXPECT_HAS(none, "troupe download gpt2");
}

TEST(ModelDir, BrokenFilesAreNamed) {
  test::TempDir dir;
  write_random_model(dir.path(), Gpt2Config::preset("tiny"), 1, test::tokenizer_dir());
  const std::string good_config = slurp(dir.file("config.json"));
  std::ofstream(dir.file("config.json"), std::ios::trunc) << "{not json";
  std::string e = load_error(dir.path());
  EXPECT_HAS(e, "config.json");
  EXPECT_HAS(e, "not valid JSON");
  EXPECT_HAS(e, "troupe download gpt2");

  std::ofstream(dir.file("config.json"), std::ios::trunc) << good_config;
  fs::resize_file(dir.file("model.safetensors"), 100);
  e = load_error(dir.path());
  EXPECT_HAS(e, "model.safetensors");
  EXPECT_HAS(e, "troupe init-model");

  // config.json from another model: the weights do not fit it.
  write_random_model(dir.path(), Gpt2Config::preset("tiny"), 1, test::tokenizer_dir());
  Gpt2Config wider = Gpt2Config::preset("tiny");
  wider.n_embd = 128;
  std::ofstream(dir.file("config.json"), std::ios::trunc) << wider.to_json();
  e = load_error(dir.path());
  EXPECT_HAS(e, "wte.weight");
  EXPECT_HAS(e, "[50257, 128]");

  // A vocabulary larger than the model's.
  Gpt2Config small_vocab = Gpt2Config::preset("tiny");
  small_vocab.vocab_size = 1000;
  small_vocab.eos_token_id = 999;
  std::ofstream(dir.file("config.json"), std::ios::trunc) << small_vocab.to_json();
  e = load_error(dir.path());
  EXPECT_HAS(e, "vocab_size");
}

TEST(ModelDir, WriteNeedsTokenizerFiles) {
  test::TempDir tok, out;
  try {
    write_random_model(out.file("m"), Gpt2Config::preset("tiny"), 1, tok.path());
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(std::string(e.what()), "vocab.json");
    EXPECT_HAS(std::string(e.what()), tok.path());
  }
  EXPECT_FALSE(fs::exists(out.file("m/model.safetensors")));
  Gpt2Config bad = Gpt2Config::preset("tiny");
  bad.n_head = 5;
  EXPECT_THROW(write_random_model(out.file("m"), bad, 1, test::tokenizer_dir()), std::invalid_argument);
}

TEST(ModelDir, WriteIntoTheTokenizerFolderItself) {
  test::TempDir dir;
  fs::copy_file(test::tokenizer_dir() + "/vocab.json", dir.file("vocab.json"));
  fs::copy_file(test::tokenizer_dir() + "/merges.txt", dir.file("merges.txt"));
  write_random_model(dir.path(), Gpt2Config::preset("tiny"), 1, dir.path());
  EXPECT_EQ(slurp(dir.file("vocab.json")), slurp(test::tokenizer_dir() + "/vocab.json"));
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(load_model_dir(dir.path()));
  testing::internal::GetCapturedStderr();
}

TEST(ModelDir, WarningNamesTheFolder) {
  const std::string w = random_weights_warning("/some/dir");
  EXPECT_HAS(w, "RANDOM WEIGHTS");
  EXPECT_HAS(w, "/some/dir");
  EXPECT_HAS(w, "NOISE");
  EXPECT_HAS(w, "troupe download gpt2");
}

}  // namespace
}  // namespace troupe::model
