#include "model/weights.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <ATen/Parallel.h>


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

}  // namespace

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

}  // namespace troupe::model
