#include "cli/job_json.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "actors/router/router_core.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;

const std::set<std::string> kFields = {"id",
                                       "prompt",
                                       "prompt_ids",
                                       "max_tokens",
                                       "temperature",
                                       "top_k",
                                       "top_p",
                                       "seed",
                                       "stop",
                                       "logprobs",
                                       "ignore_eos",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "logit_bias",
                                       "repetition_penalty",
                                       "priority",
                                       "echo",
                                       "prompt_logprobs"};

// An integer field within [lo, hi] of its type, or an error naming it: never
// narrowed (JSON integers reach 2^64 - 1; larger ones parse as floats).
template <class T>
T get_int(const json& j, const char* key, T lo = std::numeric_limits<T>::min(),
          T hi = std::numeric_limits<T>::max()) {
  const json& v = j.at(key);
  __int128 x = 0;
  if (v.is_number_unsigned())
    x = v.get<uint64_t>();
  else if (v.is_number_integer())
    x = v.get<int64_t>();
  if (!v.is_number_integer() || x < static_cast<__int128>(lo) || x > static_cast<__int128>(hi)) {
    throw std::invalid_argument(std::string("\"") + key + "\" must be an integer in [" + std::to_string(lo) +
                                ", " + std::to_string(hi) + "], got " + v.dump());
  }
  return static_cast<T>(x);
}

// A float field that is finite as a float and passes `ok`, or an error
// naming it and the range `want` describes.
template <class Ok>
float get_float(const json& j, const char* key, Ok ok, const char* want) {
  const json& v = j.at(key);
  const double d = v.is_number() ? v.get<double>() : 0.0;
  if (!v.is_number() || !std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max() ||
      !ok(static_cast<float>(d))) {
    throw std::invalid_argument(std::string("\"") + key + "\" must be " + want + ", got " + v.dump());
  }
  return static_cast<float>(d);
}

// "logit_bias": {"token id": bias in [-100, 100], ...}, OpenAI's form.
std::vector<std::pair<int32_t, float>> get_logit_bias(const json& v) {
  if (!v.is_object())
    throw std::invalid_argument("\"logit_bias\" must be an object of token id -> bias, got " + v.dump());
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, bias] : v.items()) {
    const std::optional<int32_t> id = core::token_id_from_text(key);
    if (!id)
      throw std::invalid_argument("\"logit_bias\" keys must be token ids such as \"50256\", got " +
                                  json(key).dump());
    try {
      out.emplace_back(
          *id, get_float(
                   v, key.c_str(), [](float b) { return b >= -core::kMaxBias && b <= core::kMaxBias; },
                   "a number in [-100, 100]"));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("\"logit_bias\": ") + e.what());
    }
  }
  return out;
}

}  // namespace

JobLine parse_job_line(const json& j) {
  if (!j.is_object()) throw std::invalid_argument("a line must be a JSON object");
  for (const auto& [k, v] : j.items())
    if (!kFields.count(k)) throw std::invalid_argument("unknown field \"" + k + "\"");
  JobLine line;
  transport::Submit& r = line.job;
  if (j.contains("prompt") == j.contains("prompt_ids"))
    throw std::invalid_argument("give exactly one of \"prompt\" (text) or \"prompt_ids\" (array of ids)");
  if (j.contains("prompt")) {
    if (!j["prompt"].is_string()) throw std::invalid_argument("\"prompt\" must be a string");
    r.prompt = j["prompt"].get<std::string>();
  } else {
    if (!j["prompt_ids"].is_array()) throw std::invalid_argument("\"prompt_ids\" must be an array of ids");
    r.prompt_ids.emplace();
    for (const auto& v : j["prompt_ids"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        throw std::invalid_argument("\"prompt_ids\" must hold non-negative integer ids");
      r.prompt_ids->push_back(v.get<int32_t>());
    }
  }
  if (j.contains("echo")) {
    if (!j["echo"].is_boolean()) throw std::invalid_argument("\"echo\" must be true or false");
    line.echo = j["echo"].get<bool>();
  }
  if (j.contains("prompt_logprobs"))
    line.prompt_logprobs = get_int<int32_t>(j, "prompt_logprobs", -1, core::kMaxLogprobs);
  if (j.contains("max_tokens")) {
    r.max_tokens = get_int<int32_t>(j, "max_tokens", 0);
    if (r.max_tokens == 0 && !line.echo && line.prompt_logprobs < 0)
      throw std::invalid_argument("\"max_tokens\" must be >= 1 (0 only with \"echo\" or \"prompt_logprobs\"), got 0");
  }
  if (j.contains("temperature"))
    r.temperature = get_float(
        j, "temperature", [](float t) { return t >= 0; }, "a finite number >= 0 (0 = greedy)");
  if (j.contains("top_k")) r.top_k = get_int<int32_t>(j, "top_k", 0);
  if (j.contains("top_p"))
    r.top_p = get_float(
        j, "top_p", [](float p) { return p > 0 && p <= 1; }, "a number in (0, 1]");
  if (j.contains("seed")) r.seed = get_int<uint64_t>(j, "seed");
  if (j.contains("logprobs")) r.logprobs = get_int<int32_t>(j, "logprobs", -1, core::kMaxLogprobs);
  if (j.contains("stop")) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& v : s) {
        if (!v.is_string()) throw std::invalid_argument("\"stop\" must be a string or an array of strings");
        r.stop.push_back(v.get<std::string>());
      }
    } else {
      throw std::invalid_argument("\"stop\" must be a string or an array of strings");
    }
  }
  if (j.contains("ignore_eos")) {
    if (!j["ignore_eos"].is_boolean()) throw std::invalid_argument("\"ignore_eos\" must be true or false");
    r.ignore_eos = j["ignore_eos"].get<bool>();
  }
  auto penalty = [](float x) { return x >= -core::kMaxPenalty && x <= core::kMaxPenalty; };
  if (j.contains("presence_penalty"))
    r.presence_penalty = get_float(j, "presence_penalty", penalty, "a number in [-2, 2]");
  if (j.contains("frequency_penalty"))
    r.frequency_penalty = get_float(j, "frequency_penalty", penalty, "a number in [-2, 2]");
  if (j.contains("logit_bias")) r.logit_bias = get_logit_bias(j["logit_bias"]);
  if (j.contains("repetition_penalty"))
    r.repetition_penalty = get_float(
        j, "repetition_penalty", [](float x) { return x > 0 && x <= core::kMaxRepetitionPenalty; },
        "a number in (0, 10]");
  if (j.contains("priority")) r.priority = get_int<int32_t>(j, "priority");
  r.prompt_logprobs = actors::engine_prompt_logprobs(r, line.echo, line.prompt_logprobs);
  return line;
}

void add_prompt_output(json& out, const JobLine& line, const std::vector<int32_t>& prompt_ids,
                       const std::string& prompt_text, const std::vector<core::SampledToken>& scores) {
  auto top_of = [](const core::SampledToken& t, int32_t k) {
    json top = json::array();
    for (size_t i = 0; i < t.top.size() && static_cast<int32_t>(i) < k; ++i)
      top.push_back({t.top[i].first, t.top[i].second});
    return top;
  };
  if (line.prompt_logprobs >= 0) {
    json list = json::array();
    for (size_t i = 0; i < prompt_ids.size(); ++i) {
      if (i == 0 || i > scores.size()) {
        list.push_back(nullptr);
        continue;
      }
      const core::SampledToken& t = scores[i - 1];
      list.push_back({{"id", t.id}, {"logprob", t.logprob}, {"rank", t.rank}, {"top", top_of(t, line.prompt_logprobs)}});
    }
    out["prompt_logprobs"] = std::move(list);
  }
  if (!line.echo) return;
  out["prompt_ids"] = prompt_ids;
  out["text"] = prompt_text + out.value("text", std::string());
  if (line.job.logprobs < 0) return;
  json lp = json::array();
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    if (i == 0 || i > scores.size()) {
      lp.push_back({{"id", prompt_ids[i]}, {"logprob", nullptr}, {"top", json::array()}});
      continue;
    }
    lp.push_back({{"id", scores[i - 1].id}, {"logprob", scores[i - 1].logprob}, {"top", top_of(scores[i - 1], line.job.logprobs)}});
  }
  for (const auto& x : out.value("logprobs", json::array())) lp.push_back(x);
  out["logprobs"] = std::move(lp);
}

}  // namespace troupe::cli
