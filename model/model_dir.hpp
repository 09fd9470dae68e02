#pragma once
// A model folder in Hugging Face's layout: config.json, model.safetensors,
// vocab.json, merges.txt.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/text/tokenizer.hpp"
#include "model/weights.hpp"

namespace troupe::model {

struct ModelDir {
  std::string path;
  Gpt2Config config;
  Gpt2Weights weights;  // as loaded; see release_weights
  Tokenizer tokenizer;
};

// Loads and checks every file. Throws std::runtime_error saying which file is
// missing or broken and how to get it (troupe download / troupe init-model).
// When config.random_weights is set it prints a loud warning to stderr.
ModelDir load_model_dir(const std::string& dir);

// Once the models built from dir.weights exist: a Gpt2 keeps its own copies
// (packed for the CPU's kernels, or on its device), so the loaded ones would
// only stay resident, 0.5 GB for GPT-2 124M. Empties dir.weights and hands
// the freed heap back to the kernel (malloc_trim: tune_malloc keeps freed
// memory in the process otherwise). For callers that built models from a
// copy (one per device); a single model takes std::move(dir.weights) instead
// and frees each weight as it packs it.
void release_weights(ModelDir& dir);

// The weights for one more model built from `dir`: a copy (sharing the
// tensors), or, for the last model built from it, dir.weights themselves
// (dir.weights is left empty), so that model frees each source matrix as it
// packs it and loading never holds the loaded weights and a whole packed
// copy at once.
Gpt2Weights weights_for_model(ModelDir& dir, bool last_model);

class Gpt2;
enum class WeightDtype;
// One model per distinct device of `devices` (a process's workers: those on
// one device share it), built from dir.weights in `dtype`, the last one
// taking them (weights_for_model): dir.weights is empty afterwards.
std::map<std::string, std::shared_ptr<const Gpt2>> models_per_device(ModelDir& dir,
                                                                     const std::vector<std::string>& devices,
                                                                     WeightDtype dtype);

// Writes a complete model folder with random weights (init-model). The
// tokenizer files are copied from `tokenizer_dir`. Deterministic for a seed.
void write_random_model(const std::string& dir, const Gpt2Config& config, uint64_t seed,
                        const std::string& tokenizer_dir);

// troupe convert: writes the model folder `from` again at `to` (a new folder,
// or one without config.json and model.safetensors) with its matrices — wte,
// wpe and the four per block, what --dtype bfloat16 rounds — stored in
// `dtype` (kBFloat16: BF16, rounded to nearest even as a bfloat16 model
// rounds them when it loads; kFloat32: F32), the vectors as F32, the file's
// metadata kept; then the tokenizer files and config.json (last: a folder
// with a config.json is complete). Loading the result with --dtype bfloat16
// gives the model that loading `from` with it gives, bit for bit, from half
// the bytes. Returns the bytes of the model.safetensors written. Throws
// std::invalid_argument for int8 (quantized when a model loads: a file holds
// 16 or 32 bits), for `to` = `from`, or a `to` that already holds a model;
// load_model_dir's errors for a broken `from`.
uint64_t convert_model(const std::string& from, const std::string& to, WeightDtype dtype);

// The banner printed for random-weight models.
std::string random_weights_warning(const std::string& dir);

}  // namespace troupe::model
