#include "core/sampling_params.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace troupe::core {
namespace {

// A float as a message shows it: "0.5", "0", "nan" (six significant digits).
std::string number(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

}  // namespace

void validate(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    throw std::invalid_argument("sampling: temperature must be finite and >= 0 (0 = greedy), got " +
                                number(p.temperature));
  if (p.top_k < 0)
    throw std::invalid_argument("sampling: top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    throw std::invalid_argument("sampling: top_p must be in (0, 1] (1 = off), got " + number(p.top_p));
  if (p.logprobs < -1 || p.logprobs > kMaxLogprobs)
    throw std::invalid_argument("sampling: logprobs must be -1 (off) or 0.." + std::to_string(kMaxLogprobs) +
                                ", got " + std::to_string(p.logprobs));
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > kMaxLogprobs)
    throw std::invalid_argument("sampling: prompt_logprobs must be -1 (off) or 0.." +
                                std::to_string(kMaxLogprobs) + ", got " + std::to_string(p.prompt_logprobs));
  auto penalty = [](const char* name, float v) {
    if (!(v >= -kMaxPenalty && v <= kMaxPenalty))
      throw std::invalid_argument(std::string("sampling: ") + name + " must be in [-2, 2] (0 = off), got " +
                                  number(v));
  };
  penalty("presence_penalty", p.presence_penalty);
  penalty("frequency_penalty", p.frequency_penalty);
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= kMaxRepetitionPenalty))
    throw std::invalid_argument("sampling: repetition_penalty must be in (0, 10] (1 = off), got " +
                                number(p.repetition_penalty));
  if (p.logit_bias.size() > kMaxLogitBias)
    throw std::invalid_argument("sampling: logit_bias has " + std::to_string(p.logit_bias.size()) +
                                " entries, at most " + std::to_string(kMaxLogitBias));
  int64_t last = -1;
  for (const auto& [id, bias] : p.logit_bias) {
    if (id <= last)
      throw std::invalid_argument(id < 0 ? "sampling: logit_bias names token id " + std::to_string(id)
                                         : "sampling: logit_bias ids must be strictly increasing, got " +
                                               std::to_string(id) + " after " + std::to_string(last));
    if (!(bias >= -kMaxBias && bias <= kMaxBias))
      throw std::invalid_argument("sampling: logit_bias of token " + std::to_string(id) +
                                  " must be in [-100, 100], got " + number(bias));
    last = id;
  }
}

void validate(const SamplingParams& p, int64_t vocab) {
  validate(p);
  if (!p.logit_bias.empty() && p.logit_bias.back().first >= vocab)
    throw std::invalid_argument("sampling: logit_bias names token " +
                                std::to_string(p.logit_bias.back().first) + ", outside the vocabulary [0, " +
                                std::to_string(vocab) + ")");
}

std::optional<int32_t> token_id_from_text(const std::string& text) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoi(text);
}

std::vector<std::pair<int32_t, float>> sorted_logit_bias(std::vector<std::pair<int32_t, float>> bias) {
  std::sort(bias.begin(), bias.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < bias.size(); ++i) {
    if (bias[i].first == bias[i - 1].first)
      throw std::invalid_argument("sampling: logit_bias names token " + std::to_string(bias[i].first) +
                                  " twice");
  }
  return bias;
}

}  // namespace troupe::core
