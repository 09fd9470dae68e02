#include "model/model_dir.hpp"

#include <malloc.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>

#include "model/gpt2.hpp"
#include "model/linear.hpp"
#include "model/safetensors.hpp"

namespace troupe::model {
namespace fs = std::filesystem;
namespace {

const char* const kFiles[] = {"config.json", "model.safetensors", "vocab.json", "merges.txt"};

std::string how_to_get(const std::string& dir) {
  return "run `troupe download gpt2 --to " + dir + "` for GPT-2's trained weights, or `troupe init-model --out " +
         dir + "` for a random model (tests, no network)";
}

// Runs `f`; a std::runtime_error it throws gets the hint appended.
template <typename F>
auto with_hint(const std::string& dir, F&& f) {
  try {
    return f();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) + "\nTo replace the model folder, " + how_to_get(dir));
  }
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(tmp + ": cannot create file");
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(tmp + ": write failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(path + ": cannot rename " + tmp + ": " + ec.message());
}

}  // namespace

Gpt2Weights weights_for_model(ModelDir& dir, bool last_model) {
  if (!last_model) return dir.weights;
  Gpt2Weights w = std::move(dir.weights);
  dir.weights = {};
  return w;
}

std::map<std::string, std::shared_ptr<const Gpt2>> models_per_device(ModelDir& dir,
                                                                     const std::vector<std::string>& devices,
                                                                     WeightDtype dtype) {
  std::map<std::string, std::shared_ptr<const Gpt2>> models;
  for (const std::string& d : devices) models.emplace(d, nullptr);
  size_t built = 0;
  for (const std::string& d : devices) {  // in the workers' order
    auto& m = models[d];
    if (m) continue;
    const bool last_model = ++built == models.size();
    m = std::make_shared<Gpt2>(dir.config, weights_for_model(dir, last_model), c10::Device(d), dtype);
  }
  return models;
}

void release_weights(ModelDir& dir) {
  dir.weights = {};
  malloc_trim(0);
}

ModelDir load_model_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw std::runtime_error("model folder " + dir + " does not exist or is not a folder; " +
                             how_to_get(dir));
  }
  std::string missing;
  for (const char* f : kFiles) {
    if (!fs::is_regular_file(fs::path(dir) / f, ec)) missing += (missing.empty() ? "" : ", ") + std::string(f);
  }
  if (!missing.empty()) {
    throw std::runtime_error("model folder " + dir + " lacks " + missing +
                             " (a model folder holds config.json, model.safetensors, vocab.json and "
                             "merges.txt); " + how_to_get(dir));
  }

  ModelDir m;
  m.path = dir;
  m.config = with_hint(dir, [&] { return Gpt2Config::from_json_file((fs::path(dir) / "config.json").string()); });
  if (m.config.random_weights) std::cerr << random_weights_warning(dir) << std::flush;
  m.tokenizer = with_hint(dir, [&] { return Tokenizer::from_dir(dir); });
  if (m.tokenizer.vocab_size() > m.config.vocab_size) {
    throw std::runtime_error(dir + ": vocab.json has " + std::to_string(m.tokenizer.vocab_size()) +
                             " tokens but config.json's vocab_size is " +
                             std::to_string(m.config.vocab_size) +
                             "; the files come from different models. " + how_to_get(dir));
  }
  m.weights = with_hint(dir, [&] {
    return Gpt2Weights::load((fs::path(dir) / "model.safetensors").string(), m.config);
  });
  return m;
}

void write_random_model(const std::string& dir, const Gpt2Config& config, uint64_t seed,
                        const std::string& tokenizer_dir) {
  config.validate();
  for (const char* f : {"vocab.json", "merges.txt"}) {
    std::error_code ec;
    if (!fs::is_regular_file(fs::path(tokenizer_dir) / f, ec)) {
      throw std::runtime_error("tokenizer folder " + tokenizer_dir + " lacks " + f +
                               "; GPT-2's vocab.json and merges.txt are needed even for a random "
                               "model (get them with `troupe download gpt2 --to DIR`, or from "
                               "https://huggingface.co/gpt2/resolve/main/" + f + ")");
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create model folder " + dir + ": " + ec.message());

  Gpt2Config c = config;
  c.random_weights = true;
  const Gpt2Weights w = Gpt2Weights::random(c, seed);
  write_safetensors((fs::path(dir) / "model.safetensors").string(), w.named(),
                    {{"format", "pt"},
                     {"troupe_random_weights", "true"},
                     {"troupe_seed", std::to_string(seed)}});
  for (const char* f : {"vocab.json", "merges.txt"}) {
    const fs::path from = fs::path(tokenizer_dir) / f;
    const fs::path to = fs::path(dir) / f;
    if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) continue;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) throw std::runtime_error("cannot copy " + from.string() + " to " + to.string() + ": " + ec.message());
  }
  // config.json last: a folder with a config.json is complete.
  write_text((fs::path(dir) / "config.json").string(), c.to_json());
}

uint64_t convert_model(const std::string& from, const std::string& to, WeightDtype dtype) {
  if (dtype != WeightDtype::kFloat32 && dtype != WeightDtype::kBFloat16)
    throw std::invalid_argument(
        "convert: a model file holds float32 or bfloat16 weights; int8 is made from them when a model loads "
        "(--quantization int8 on the command that loads it)");
  std::error_code ec;
  if (fs::exists(to, ec) && fs::equivalent(from, to, ec))
    throw std::invalid_argument("convert: --out " + to +
                                " is the model folder itself; write to a new folder");
  for (const char* f : {"config.json", "model.safetensors"})
    if (fs::exists(fs::path(to) / f, ec))
      throw std::invalid_argument("convert: " + to + " already holds " + f + "; write to a new folder");
  ModelDir m = load_model_dir(from);
  const fs::path src = fs::path(from) / "model.safetensors";
  std::map<std::string, std::string> metadata = SafetensorsFile(src.string()).metadata();
  metadata["format"] = "pt";
  const bool bf16 = dtype == WeightDtype::kBFloat16;
  metadata["troupe_dtype"] = bf16 ? "bfloat16" : "float32";
  std::vector<std::pair<std::string, torch::Tensor>> named = m.weights.named();
  m.weights = {};
  for (auto& [name, t] : named) {
    // The matrices (2-D) are what a bfloat16 model rounds; vectors stay fp32.
    torch::Tensor out = t.to(bf16 && t.dim() == 2 ? torch::kBFloat16 : torch::kFloat32).contiguous();
    if (out.data_ptr() != t.data_ptr()) release_mapped_pages(t);  // the source's pages, once read
    t = std::move(out);
  }
  fs::create_directories(to, ec);
  if (ec) throw std::runtime_error("cannot create model folder " + to + ": " + ec.message());
  const fs::path dst = fs::path(to) / "model.safetensors";
  write_safetensors(dst.string(), named, metadata);
  for (const char* f : {"vocab.json", "merges.txt", "config.json"}) {  // config.json last
    fs::copy_file(fs::path(from) / f, fs::path(to) / f, fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw std::runtime_error("cannot copy " + (fs::path(from) / f).string() + " to " + to + ": " +
                               ec.message());
  }
  return static_cast<uint64_t>(fs::file_size(dst));
}

std::string random_weights_warning(const std::string& dir) {
  const std::string bar(72, '!');
  return bar + "\n" +
         "!!  RANDOM WEIGHTS: " + dir + "\n" +
         "!!  This model was made by `troupe init-model`: its weights are random\n" +
         "!!  numbers, not GPT-2's trained weights. Everything it generates is NOISE.\n" +
         "!!  It is good for tests and timing only. For real text, get GPT-2:\n" +
         "!!      troupe download gpt2 --to DIR\n" +
         "!!  (or fetch config.json, model.safetensors, vocab.json and merges.txt from\n" +
         "!!  https://huggingface.co/gpt2/tree/main into one folder).\n" + bar + "\n";
}

}  // namespace troupe::model
