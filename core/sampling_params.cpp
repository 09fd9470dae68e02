#include "core/sampling_params.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::core {

void validate(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    throw std::invalid_argument("sampling: temperature must be finite and >= 0 (0 = greedy), got " +
                                std::to_string(p.temperature));
  if (p.top_k < 0)
    throw std::invalid_argument("sampling: top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    throw std::invalid_argument("sampling: top_p must be in (0, 1] (1 = off), got " +
                                std::to_string(p.top_p));
  if (p.logprobs < -1 || p.logprobs > kMaxLogprobs)
    throw std::invalid_argument("sampling: logprobs must be -1 (off) or 0.." + std::to_string(kMaxLogprobs) +
                                ", got " + std::to_string(p.logprobs));
}

}  // namespace troupe::core
