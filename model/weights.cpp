#include "model/weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <ATen/Parallel.h>
#include <xxhash.h>

#include "model/safetensors.hpp"

namespace troupe::model {
namespace {

// SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014): a counter-based stream, so element i of a tensor
// depends only on (seed, tensor index, i): the same on every machine, thread
// count and vector width.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Fills `t` (fp32, contiguous, CPU) with normal(0, std) by Box-Muller in double.
void fill_normal(torch::Tensor& t, double std, uint64_t seed, uint64_t stream) {
  float* p = t.data_ptr<float>();
  const int64_t n = t.numel();
  const uint64_t key = splitmix64(seed ^ splitmix64(stream + 0x5DEECE66DULL));
  const int64_t pairs = (n + 1) / 2;
  at::parallel_for(0, pairs, 1 << 14, [&](int64_t begin, int64_t end) {
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    for (int64_t k = begin; k < end; ++k) {
      const uint64_t a = splitmix64(key + 2 * static_cast<uint64_t>(k));
      const uint64_t b = splitmix64(key + 2 * static_cast<uint64_t>(k) + 1);
      // u1 in (0, 1], u2 in [0, 1): 53-bit mantissas.
      const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1)) * std;
      p[2 * k] = static_cast<float>(r * std::cos(kTwoPi * u2));
      if (2 * k + 1 < n) p[2 * k + 1] = static_cast<float>(r * std::sin(kTwoPi * u2));
    }
  });
}

std::string layer_prefix(size_t i) { return "h." + std::to_string(i) + "."; }

std::string shape_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The file's name for HF name `name`: as is, or under GPT2LMHeadModel's
// "transformer." prefix; empty when absent.
std::string find_name(const SafetensorsFile& f, const std::string& name) {
  if (f.contains(name)) return name;
  if (f.contains("transformer." + name)) return "transformer." + name;
  return {};
}

}  // namespace

Gpt2Weights Gpt2Weights::load(const std::string& safetensors_path, const Gpt2Config& config) {
  config.validate();
  const SafetensorsFile file(safetensors_path);
  const auto fail = [&](const std::string& what) {
    throw std::runtime_error(safetensors_path + ": " + what);
  };

  if (!find_name(file, layer_prefix(config.n_layer) + "ln_1.weight").empty()) {
    fail("holds more than the " + std::to_string(config.n_layer) +
         " layers that config.json's n_layer says (found " + layer_prefix(config.n_layer) +
         "ln_1.weight); config.json and model.safetensors come from different models");
  }

  // The matrices a model packs (wte, the four per block: all but 3 MB of
  // GPT-2's bytes) stay in the mapped file, in its dtype, until it packs them
  // (SafetensorsFile::map), so loading never holds them all on the heap, nor
  // a 16-bit file's matrices widened. What a model keeps as loaded (wpe, the
  // vectors) is copied as fp32.
  const auto get = [&](const std::string& name, std::vector<int64_t> want, bool packed = false) {
    const std::string key = find_name(file, name);
    if (key.empty()) {
      fail("tensor \"" + name + "\" (or \"transformer." + name + "\") is missing; expected shape " +
           shape_str(want));
    }
    const SafetensorsEntry& e = file.entry(key);
    if (e.shape != want) {
      fail("tensor \"" + key + "\" has shape " + shape_str(e.shape) + ", expected " + shape_str(want) +
           " (from config.json)");
    }
    return packed ? file.map(key) : file.to_float(key);
  };

  const int64_t E = config.n_embd;
  Gpt2Weights w;
  w.wte = get("wte.weight", {config.vocab_size, E}, true);
  w.wpe = get("wpe.weight", {config.n_positions, E});
  w.layers.resize(config.n_layer);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = layer_prefix(i);
    l.ln_1_weight = get(p + "ln_1.weight", {E});
    l.ln_1_bias = get(p + "ln_1.bias", {E});
    l.attn_c_attn_weight = get(p + "attn.c_attn.weight", {E, 3 * E}, true);
    l.attn_c_attn_bias = get(p + "attn.c_attn.bias", {3 * E});
    l.attn_c_proj_weight = get(p + "attn.c_proj.weight", {E, E}, true);
    l.attn_c_proj_bias = get(p + "attn.c_proj.bias", {E});
    l.ln_2_weight = get(p + "ln_2.weight", {E});
    l.ln_2_bias = get(p + "ln_2.bias", {E});
    l.mlp_c_fc_weight = get(p + "mlp.c_fc.weight", {E, 4 * E}, true);
    l.mlp_c_fc_bias = get(p + "mlp.c_fc.bias", {4 * E});
    l.mlp_c_proj_weight = get(p + "mlp.c_proj.weight", {4 * E, E}, true);
    l.mlp_c_proj_bias = get(p + "mlp.c_proj.bias", {E});
  }
  w.ln_f_weight = get("ln_f.weight", {E});
  w.ln_f_bias = get("ln_f.bias", {E});

  // GPT-2 ties the LM head to wte; a stored copy is only checked, never used.
  if (file.contains("lm_head.weight")) {
    const SafetensorsEntry& e = file.entry("lm_head.weight");
    const std::vector<int64_t> want = {config.vocab_size, E};
    if (e.shape != want) {
      fail("tensor \"lm_head.weight\" has shape " + shape_str(e.shape) + ", expected " +
           shape_str(want) + " (tied to wte.weight)");
    }
  }
  return w;
}

Gpt2Weights Gpt2Weights::random(const Gpt2Config& config, uint64_t seed) {
  config.validate();
  const int64_t E = config.n_embd;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU);
  uint64_t stream = 0;
  auto normal = [&](std::vector<int64_t> shape, double std) {
    torch::Tensor t = torch::empty(shape, opts);
    fill_normal(t, std, seed, stream++);
    return t;
  };
  auto zeros = [&](int64_t n) { return torch::zeros({n}, opts); };
  auto ones = [&](int64_t n) { return torch::ones({n}, opts); };

  // GPT-2 (Radford et al. 2019, section 2.3) scales the residual projections by
  // 1/sqrt(N) with N = 2 * n_layer residual branches; HF uses the same init.
  const double std = 0.02;
  const double proj_std = 0.02 / std::sqrt(2.0 * config.n_layer);

  Gpt2Weights w;
  w.wte = normal({config.vocab_size, E}, std);
  w.wpe = normal({config.n_positions, E}, std);
  w.layers.resize(config.n_layer);
  for (auto& l : w.layers) {
    l.ln_1_weight = ones(E);
    l.ln_1_bias = zeros(E);
    l.attn_c_attn_weight = normal({E, 3 * E}, std);
    l.attn_c_attn_bias = zeros(3 * E);
    l.attn_c_proj_weight = normal({E, E}, proj_std);
    l.attn_c_proj_bias = zeros(E);
    l.ln_2_weight = ones(E);
    l.ln_2_bias = zeros(E);
    l.mlp_c_fc_weight = normal({E, 4 * E}, std);
    l.mlp_c_fc_bias = zeros(4 * E);
    l.mlp_c_proj_weight = normal({4 * E, E}, proj_std);
    l.mlp_c_proj_bias = zeros(E);
  }
  w.ln_f_weight = ones(E);
  w.ln_f_bias = zeros(E);
  return w;
}

std::vector<std::pair<std::string, torch::Tensor>> Gpt2Weights::named() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.reserve(4 + 12 * layers.size());
  out.emplace_back("wte.weight", wte);
  out.emplace_back("wpe.weight", wpe);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerWeights& l = layers[i];
    const std::string p = layer_prefix(i);
    out.emplace_back(p + "ln_1.weight", l.ln_1_weight);
    out.emplace_back(p + "ln_1.bias", l.ln_1_bias);
    out.emplace_back(p + "attn.c_attn.weight", l.attn_c_attn_weight);
    out.emplace_back(p + "attn.c_attn.bias", l.attn_c_attn_bias);
    out.emplace_back(p + "attn.c_proj.weight", l.attn_c_proj_weight);
    out.emplace_back(p + "attn.c_proj.bias", l.attn_c_proj_bias);
    out.emplace_back(p + "ln_2.weight", l.ln_2_weight);
    out.emplace_back(p + "ln_2.bias", l.ln_2_bias);
    out.emplace_back(p + "mlp.c_fc.weight", l.mlp_c_fc_weight);
    out.emplace_back(p + "mlp.c_fc.bias", l.mlp_c_fc_bias);
    out.emplace_back(p + "mlp.c_proj.weight", l.mlp_c_proj_weight);
    out.emplace_back(p + "mlp.c_proj.bias", l.mlp_c_proj_bias);
  }
  out.emplace_back("ln_f.weight", ln_f_weight);
  out.emplace_back("ln_f.bias", ln_f_bias);
  return out;
}

uint64_t fingerprint(const Gpt2Config& config, const Gpt2Weights& weights) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  const int64_t shape[] = {config.n_layer, config.n_head,        config.n_embd,
                           config.n_positions, config.vocab_size, config.eos_token_id};
  XXH3_64bits_update(state, shape, sizeof shape);
  XXH3_64bits_update(state, &config.layer_norm_epsilon, sizeof config.layer_norm_epsilon);
  for (const auto& [name, tensor] : weights.named()) {
    XXH3_64bits_update(state, name.data(), name.size());
    const torch::Tensor t = tensor.to(torch::kCPU).contiguous().view({-1});  // in its own dtype
    // In pieces of 1 Mi values, each widened to fp32 (a 16-bit file's
    // matrix: never whole), hashed, and let go once read: a weight still in
    // its file (SafetensorsFile::map) is not made resident whole by being hashed.
    constexpr int64_t kPiece = int64_t{1} << 20;
    for (int64_t i = 0; i < t.numel(); i += kPiece) {
      const torch::Tensor piece = t.narrow(0, i, std::min(kPiece, t.numel() - i));
      const torch::Tensor values = piece.to(torch::kFloat32).contiguous();
      XXH3_64bits_update(state, values.data_ptr<float>(),
                         static_cast<size_t>(values.numel()) * sizeof(float));
      release_mapped_pages(piece);
    }
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

}  // namespace troupe::model
