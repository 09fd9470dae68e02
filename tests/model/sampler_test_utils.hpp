#pragma once
// Logit rows and sampling parameters for the sampler's tests.
#include <cstdint>
#include <random>
#include <vector>

#include "core/sampling_params.hpp"

namespace troupe::test {

// vocab logits drawn from N(0, stddev^2).
inline std::vector<float> gaussian_logits(int64_t vocab, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& x : l) x = dist(rng);
  return l;
}

inline core::SamplingParams params(float temperature, int32_t top_k = 0, float top_p = 1.0f,
                                    uint64_t seed = 7, int32_t logprobs = -1) {
  core::SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  p.logprobs = logprobs;
  return p;
}

}  // namespace troupe::test
