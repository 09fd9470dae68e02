#pragma once
// Gpt2Weights: GPT-2's parameters as Hugging Face stores them (Conv1D weights
// are [in, out]), on the CPU. Loaded from model.safetensors: the vectors and
// wpe as fp32, the matrices a model packs (wte and the four per block) over
// the file's mapping in its dtype — fp32, or half / bfloat16 from an F16 /
// BF16 file, which Gpt2 widens one matrix at a time as it packs it.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "model/config.hpp"

namespace troupe::model {

struct LayerWeights {
  torch::Tensor ln_1_weight, ln_1_bias;            // [E]
  torch::Tensor attn_c_attn_weight;                // [E, 3E]
  torch::Tensor attn_c_attn_bias;                  // [3E]
  torch::Tensor attn_c_proj_weight;                // [E, E]
  torch::Tensor attn_c_proj_bias;                  // [E]
  torch::Tensor ln_2_weight, ln_2_bias;            // [E]
  torch::Tensor mlp_c_fc_weight;                   // [E, 4E]
  torch::Tensor mlp_c_fc_bias;                     // [4E]
  torch::Tensor mlp_c_proj_weight;                 // [4E, E]
  torch::Tensor mlp_c_proj_bias;                   // [E]
};

struct Gpt2Weights {
  torch::Tensor wte;   // [vocab, E]; also the LM head (tied)
  torch::Tensor wpe;   // [n_positions, E]
  std::vector<LayerWeights> layers;
  torch::Tensor ln_f_weight, ln_f_bias;  // [E]

  // Reads model.safetensors (F32, F16 or BF16, above; names with or without the
  // "transformer." prefix; lm_head.weight optional and must equal wte's shape).
  // Throws std::runtime_error naming the tensor or byte offset on any defect.
  static Gpt2Weights load(const std::string& safetensors_path, const Gpt2Config& config);
  // GPT-2's initialisation (normal(0, 0.02), LayerNorm 1/0), deterministic for a seed.
  static Gpt2Weights random(const Gpt2Config& config, uint64_t seed);
  // HF names ("h.0.attn.c_attn.weight", "wte.weight", ...) in a stable order, for saving.
  std::vector<std::pair<std::string, torch::Tensor>> named() const;
};

// A 64-bit name of a model: XXH3 over the config's shape and every weight's
// name and fp32 bytes. Workers report it when they join; the head refuses a
// worker whose model differs from the others'. Reads every weight once.
uint64_t fingerprint(const Gpt2Config& config, const Gpt2Weights& weights);

}  // namespace troupe::model
