#include "cluster/http/openai_api.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "actors/router/router_core.hpp"
#include "cluster/http/json_input.hpp"
#include "core/splitmix.hpp"
#include "model/text/tokenizer.hpp"

namespace troupe::cluster::openai {
namespace {

using nlohmann::json;

// Thrown inside the parser only; becomes its ApiError result.
struct Bad {
  ApiError error;
};

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw Bad{ApiError{400, message, "invalid_request_error", param, ""}};
}

std::string kind_of(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// The value of `key`, or nullptr when absent or null (OpenAI: null = default).
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// An integer, or a float with no fraction (2.0): OpenAI's API and vLLM's
// (pydantic's lax mode) take those where they want an integer; 2.5 is refused.
int64_t integer(const json& v, const std::string& key, int64_t lo, int64_t hi) {
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) != d || std::fabs(d) > 9007199254740992.0)  // past 2^53 a double skips integers
      bad(key, key + " must be an integer, got " + v.dump());
    const auto x = static_cast<int64_t>(d);
    if (x < lo || x > hi)
      bad(key, key + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    return x;
  }
  if (!v.is_number_integer()) bad(key, key + " must be an integer, got " + kind_of(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    bad(key, key + " must be at most " + std::to_string(hi));
  }
  const int64_t x = v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
  if (x < lo || x > hi) {
    bad(key, key + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                 std::to_string(x));
  }
  return x;
}

double number(const json& v, const std::string& key) {
  if (!v.is_number()) bad(key, key + " must be a number, got " + kind_of(v));
  return v.get<double>();
}

bool boolean(const json& v, const std::string& key) {
  if (!v.is_boolean()) bad(key, key + " must be true or false, got " + kind_of(v));
  return v.get<bool>();
}

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

std::vector<int32_t> token_ids(const json& a, const std::string& key) {
  std::vector<int32_t> ids;
  ids.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ids.push_back(static_cast<int32_t>(
        integer(a[i], key + "[" + std::to_string(i) + "]", std::numeric_limits<int32_t>::min(), kI32Max)));
  }
  return ids;
}

// prompt: a string, a list of token ids, or a list of either (a batch).
std::vector<transport::Submit> prompts(const json& p) {
  std::vector<transport::Submit> out;
  auto text = [&](const std::string& s) {
    transport::Submit j;
    j.prompt = s;
    out.push_back(std::move(j));
  };
  auto ids = [&](std::vector<int32_t> v) {
    transport::Submit j;
    j.prompt_ids = std::move(v);
    out.push_back(std::move(j));
  };
  if (p.is_string()) {
    text(p.get<std::string>());
  } else if (p.is_array() && !p.empty()) {
    if (p[0].is_number()) {
      ids(token_ids(p, "prompt"));
    } else {
      for (size_t i = 0; i < p.size(); ++i) {
        const std::string key = "prompt[" + std::to_string(i) + "]";
        if (p[i].is_string()) {
          text(p[i].get<std::string>());
        } else if (p[i].is_array() && !p[i].empty()) {
          ids(token_ids(p[i], key));
        } else {
          bad("prompt", key + " must be a string or a non-empty list of token ids, got " + kind_of(p[i]));
        }
      }
    }
  } else {
    bad("prompt", "prompt must be a string, a non-empty list of token ids, or a list of either");
  }
  return out;
}

// logit_bias: {"token id": bias, ...} (OpenAI's form: the ids are strings).
// The router checks the ids against the vocabulary and the biases' range.
std::vector<std::pair<int32_t, float>> logit_bias(const json& v) {
  if (!v.is_object())
    bad("logit_bias", "logit_bias must be an object of token id -> bias, got " + kind_of(v));
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, bias] : v.items()) {
    const std::optional<int32_t> id = core::token_id_from_text(key);
    const std::string shown = "\"" + (key.size() <= 32 ? key : key.substr(0, 32) + "...") + "\"";
    if (!id) bad("logit_bias", "logit_bias keys must be token ids such as \"50256\", got " + shown);
    if (!bias.is_number())
      bad("logit_bias", "logit_bias[" + shown + "] must be a number, got " + kind_of(bias));
    out.emplace_back(*id, static_cast<float>(bias.get<double>()));
  }
  return out;
}

// Fields troupe does not implement: refused unless they ask for the default.
void refuse_unsupported(const json& b, int32_t n) {
  if (field(b, "suffix")) bad("suffix", "suffix is not supported");
  if (const json* v = field(b, "best_of"); v && integer(*v, "best_of", 1, kMaxChoices) != n) {
    bad("best_of", "best_of is not supported (it must equal n)");
  }
  if (const json* v = field(b, "min_tokens"); v && integer(*v, "min_tokens", 0, kI32Max) != 0) {
    bad("min_tokens", "min_tokens is not supported");
  }
}

CompletionRequest parse(const json& b, const std::string& served_model) {
  if (!b.is_object()) bad("", "the body must be a JSON object");
  if (const json* m = field(b, "model")) {
    if (!m->is_string()) bad("model", "model must be a string");
    if (m->get<std::string>() != served_model) {
      throw Bad{ApiError{404,
                         "The model '" + m->get<std::string>() + "' does not exist; this server serves '" +
                             served_model + "' (GET /v1/models)",
                         "invalid_request_error", "model", "model_not_found"}};
    }
  }
  const json* p = field(b, "prompt");
  if (!p) bad("prompt", "prompt is required");
  CompletionRequest r;
  if (const json* v = field(b, "n")) r.n = static_cast<int32_t>(integer(*v, "n", 1, kMaxChoices));
  if (const json* v = field(b, "stream")) r.stream = boolean(*v, "stream");
  if (const json* v = field(b, "stream_options")) {
    if (!r.stream) bad("stream_options", "stream_options is only allowed with stream: true");
    if (!v->is_object()) bad("stream_options", "stream_options must be an object");
    if (const json* u = field(*v, "include_usage"))
      r.include_usage = boolean(*u, "stream_options.include_usage");
  }
  refuse_unsupported(b, r.n);

  transport::Submit base;
  if (const json* v = field(b, "echo")) r.echo = boolean(*v, "echo");
  if (const json* v = field(b, "prompt_logprobs"); v && !v->is_null())  // vLLM's extension
    r.prompt_logprobs = static_cast<int32_t>(integer(*v, "prompt_logprobs", 0, kI32Max));
  if (const json* v = field(b, "max_tokens")) {
    base.max_tokens = static_cast<int32_t>(integer(*v, "max_tokens", 0, kI32Max));
    if (base.max_tokens == 0 && !r.echo && r.prompt_logprobs < 0)
      bad("max_tokens", "max_tokens must be >= 1 (0 only with echo or prompt_logprobs: scoring the prompt)");
  }
  if (const json* v = field(b, "temperature"))
    base.temperature = static_cast<float>(number(*v, "temperature"));
  if (const json* v = field(b, "top_p")) base.top_p = static_cast<float>(number(*v, "top_p"));
  if (const json* v = field(b, "top_k")) {
    const int64_t k = integer(*v, "top_k", -1, kI32Max);
    base.top_k = k < 0 ? 0 : static_cast<int32_t>(k);  // vLLM: -1 = off
  }
  if (const json* v = field(b, "logprobs"); v && !v->is_null())
    base.logprobs = static_cast<int32_t>(integer(*v, "logprobs", 0, kI32Max));
  r.logprobs = base.logprobs;
  if (const json* v = field(b, "ignore_eos")) base.ignore_eos = boolean(*v, "ignore_eos");
  if (const json* v = field(b, "presence_penalty"))
    base.presence_penalty = static_cast<float>(number(*v, "presence_penalty"));
  if (const json* v = field(b, "frequency_penalty"))
    base.frequency_penalty = static_cast<float>(number(*v, "frequency_penalty"));
  if (const json* v = field(b, "logit_bias")) base.logit_bias = logit_bias(*v);
  if (const json* v = field(b, "repetition_penalty"))  // vLLM's extension
    base.repetition_penalty = static_cast<float>(number(*v, "repetition_penalty"));
  if (const json* v = field(b, "priority")) {
    base.priority =
        static_cast<int32_t>(integer(*v, "priority", std::numeric_limits<int32_t>::min(), kI32Max));
  }
  if (const json* v = field(b, "seed")) {
    if (!v->is_number_integer()) bad("seed", "seed must be an integer, got " + kind_of(*v));
    base.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (const json* v = field(b, "stop")) {
    if (v->is_string()) {
      base.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_string()) bad("stop", "stop[" + std::to_string(i) + "] must be a string");
        base.stop.push_back((*v)[i].get<std::string>());
      }
    } else {
      bad("stop", "stop must be a string or a list of strings, got " + kind_of(*v));
    }
  }
  base.prompt_logprobs = actors::engine_prompt_logprobs(base, r.echo, r.prompt_logprobs);
  const std::vector<transport::Submit> ps = prompts(*p);
  if (ps.size() * static_cast<size_t>(r.n) > static_cast<size_t>(kMaxChoices)) {
    bad("n", std::to_string(ps.size()) + " prompts x n = " + std::to_string(r.n) + " is over " +
                 std::to_string(kMaxChoices) + " choices in one request");
  }
  for (const transport::Submit& prompt : ps) {
    for (int32_t c = 0; c < r.n; ++c) {
      transport::Submit j = base;
      j.prompt = prompt.prompt;
      j.prompt_ids = prompt.prompt_ids;
      j.tag = r.jobs.size();
      if (base.seed) j.seed = seed_for_choice(*base.seed, c);
      r.jobs.push_back(std::move(j));
    }
  }
  return r;
}

// Characters of UTF-8 text (bytes that do not continue a character).
int64_t characters(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

json to_json(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

ApiError from_rejected(const transport::Rejected& r) {
  switch (r.code) {
    case transport::RejectCode::kBusy:
      return ApiError{429, r.message, "server_error", "", "busy"};
    case transport::RejectCode::kTooLong:
      return ApiError{413, r.message, "invalid_request_error", "prompt", "context_length_exceeded"};
    case transport::RejectCode::kNoWorkers:
      return ApiError{503, r.message, "server_error", "", "no_workers"};
    case transport::RejectCode::kShuttingDown:
      return ApiError{503, r.message, "server_error", "", "shutting_down"};
    case transport::RejectCode::kInvalid:
      break;
  }
  // The field the router's check names (actors::admit_job's messages), as OpenAI's `param`.
  static const std::pair<const char*, const char*> kStarts[] = {
      {"sampling: temperature", "temperature"},
      {"sampling: top_k", "top_k"},
      {"sampling: top_p", "top_p"},
      {"sampling: logprobs", "logprobs"},
      {"sampling: prompt_logprobs", "prompt_logprobs"},
      {"sampling: presence_penalty", "presence_penalty"},
      {"sampling: frequency_penalty", "frequency_penalty"},
      {"sampling: logit_bias", "logit_bias"},
      {"sampling: repetition_penalty", "repetition_penalty"},
      {"prompt", "prompt"},
      {"the prompt", "prompt"},
      {"max_tokens", "max_tokens"}};
  std::string param = r.message.find("stop string") != std::string::npos ? "stop" : "";
  for (const auto& [start, field] : kStarts)
    if (param.empty() && r.message.rfind(start, 0) == 0) param = field;
  return ApiError{400, r.message, "invalid_request_error", param, ""};
}

std::variant<CompletionRequest, ApiError> parse_completion_request(const std::string& body,
                                                                   const std::string& served_model) {
  json b;
  try {
    b = parse_json_input(body);
  } catch (const JsonInputError& e) {  // not JSON, or a number past a double's range ("temperature": 1e999)
    return ApiError{400, e.field().empty() ? std::string("the body is ") + e.what() : e.what(),
                    "invalid_request_error", e.field(), ""};
  }
  try {
    return parse(b, served_model);
  } catch (const Bad& e) {
    return e.error;
  }
}

uint64_t seed_for_choice(uint64_t seed, int32_t choice) {
  return choice == 0 ? seed : core::splitmix64(seed ^ core::splitmix64(static_cast<uint64_t>(choice)));
}

const char* finish_reason_name(core::FinishReason reason) {
  switch (reason) {
    case core::FinishReason::kEos:
    case core::FinishReason::kStop:
      return "stop";
    case core::FinishReason::kLength:
      return "length";
    case core::FinishReason::kCancelled:
      return "abort";
    case core::FinishReason::kError:
      break;
  }
  return "error";
}

CompletionBuilder::CompletionBuilder(const CompletionRequest& request, std::string id, int64_t created_unix,
                                     std::string model, const model::Tokenizer& tokenizer)
    : id_(std::move(id)),
      model_(std::move(model)),
      created_(created_unix),
      include_usage_(request.include_usage),
      want_logprobs_(request.logprobs >= 0),
      echo_(request.echo),
      logprobs_(request.logprobs),
      prompt_logprobs_(request.prompt_logprobs),
      n_(request.n),
      tokenizer_(tokenizer),
      choices_(request.jobs.size()),
      remaining_(request.jobs.size()) {
  if (!echo_) return;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const transport::Submit& j = request.jobs[i];
    choices_[i].echo = j.prompt ? *j.prompt : j.prompt_ids ? tokenizer.decode(*j.prompt_ids) : std::string();
  }
}

json CompletionBuilder::chunk(size_t index, const std::string& text, json logprobs,
                              json finish_reason) const {
  json c{{"id", id_},
         {"object", "text_completion"},
         {"created", created_},
         {"model", model_},
         {"choices", json::array({{{"index", index},
                                   {"text", text},
                                   {"logprobs", std::move(logprobs)},
                                   {"finish_reason", std::move(finish_reason)}}})}};
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

// OpenAI's legacy logprobs for the tokens of one reply, appended to the
// choice's own as well: tokens, token_logprobs, top_logprobs (the chosen
// token among them, as vLLM does), text_offset (characters before each token).
json CompletionBuilder::logprobs_of(Choice& c, const transport::Tokens& t) {
  json part{{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  for (const core::SampledToken& s : t.logprobs) {
    const std::string tok = tokenizer_.decode({s.id});
    json top = json::object();
    for (const auto& [id, lp] : s.top) top[tokenizer_.decode({id})] = lp;
    top[tok] = s.logprob;
    part["tokens"].push_back(tok);
    part["token_logprobs"].push_back(s.logprob);
    part["top_logprobs"].push_back(std::move(top));
    part["text_offset"].push_back(c.text_offset);
    c.text_offset += characters(tok);
  }
  append_logprobs(c, part);
  return part;
}

void CompletionBuilder::append_logprobs(Choice& c, const json& part) {
  if (c.logprobs.empty())
    c.logprobs = json{{"tokens", json::array()},
                      {"token_logprobs", json::array()},
                      {"top_logprobs", json::array()},
                      {"text_offset", json::array()}};
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const auto& x : part[k]) c.logprobs[k].push_back(x);
  }
}

// The prompt's tokens in the legacy shape (null logprob and top for the
// first, which nothing predicts), counted from offset 0; and vLLM's
// prompt_logprobs: null, then per token {"id": {"logprob", "rank",
// "decoded_token"}} for the token itself and its top alternatives (ranks 1..K).
json CompletionBuilder::prompt_part(Choice& c, const transport::Tokens& t) {
  json part{{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  c.prompt_logprobs = json::array();
  int64_t offset = 0;
  for (size_t i = 0; i < t.prompt_ids.size(); ++i) {
    const std::string tok = tokenizer_.decode({t.prompt_ids[i]});
    part["tokens"].push_back(tok);
    part["text_offset"].push_back(offset);
    offset += characters(tok);
    if (i == 0 || i > t.prompt_logprobs.size()) {
      part["token_logprobs"].push_back(nullptr);
      part["top_logprobs"].push_back(nullptr);
      c.prompt_logprobs.push_back(nullptr);
      continue;
    }
    const core::SampledToken& s = t.prompt_logprobs[i - 1];
    json top = json::object(), ranked = json::object();
    const size_t k_echo = static_cast<size_t>(std::max(logprobs_, 0));
    const size_t k_prompt = static_cast<size_t>(std::max(prompt_logprobs_, 0));
    for (size_t k = 0; k < s.top.size(); ++k) {
      const std::string alt = tokenizer_.decode({s.top[k].first});
      if (k < k_echo) top[alt] = s.top[k].second;
      if (k < k_prompt)
        ranked[std::to_string(s.top[k].first)] = {
            {"logprob", s.top[k].second}, {"rank", k + 1}, {"decoded_token", alt}};
    }
    top[tok] = s.logprob;
    ranked[std::to_string(s.id)] = {{"logprob", s.logprob}, {"rank", s.rank}, {"decoded_token", tok}};
    part["token_logprobs"].push_back(s.logprob);
    part["top_logprobs"].push_back(std::move(top));
    c.prompt_logprobs.push_back(std::move(ranked));
  }
  return part;
}

std::optional<json> CompletionBuilder::on_tokens(const transport::Tokens& t) {
  if (t.tag >= choices_.size() || choices_[t.tag].finished) return std::nullopt;
  Choice& c = choices_[t.tag];
  if (!t.prompt_ids.empty()) {  // the prompt's own part, before any generated token
    json part = prompt_part(c, t);
    std::string text;
    json lp = nullptr;
    if (echo_ && !c.echoed) {
      c.echoed = true;
      text = c.echo;
      c.text += text;
      c.text_offset = characters(c.echo);
      if (want_logprobs_) {
        append_logprobs(c, part);
        lp = std::move(part);
      }
    }
    json out = chunk(t.tag, text, std::move(lp), nullptr);
    if (prompt_logprobs_ >= 0) out["choices"][0]["prompt_logprobs"] = c.prompt_logprobs;
    return out;
  }
  std::string text = t.text;
  if (echo_ && !c.echoed) {  // echo without logprobs: the prompt's text comes with the first chunk
    c.echoed = true;
    text = c.echo + text;
    c.text_offset = characters(c.echo);
  }
  c.text += text;
  json lp = want_logprobs_ ? logprobs_of(c, t) : json(nullptr);
  return chunk(t.tag, text, std::move(lp), nullptr);
}

std::optional<json> CompletionBuilder::on_finished(const transport::Finished& f) {
  if (f.tag >= choices_.size() || choices_[f.tag].finished) return std::nullopt;
  Choice& c = choices_[f.tag];
  std::string text = f.text;
  if (echo_ && !c.echoed) {
    c.echoed = true;
    text = c.echo + text;
  }
  c.text += text;
  c.finished = true;
  c.last = f;
  c.finish_reason = finish_reason_name(f.finish_reason);
  --remaining_;
  if (f.finish_reason == core::FinishReason::kError && !failure_) {
    failure_ = ApiError{500, "generation failed: " + f.error, "server_error", "", ""};
  }
  return chunk(f.tag, text, nullptr, c.finish_reason);
}

json CompletionBuilder::usage() const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const core::Usage& u = choices_[i].last.usage;
    completion += u.completion_tokens;
    if (i % static_cast<size_t>(n_) == 0) {  // a prompt counts once, whatever n is
      prompt += u.prompt_tokens;
      cached += u.cached_tokens;
    }
  }
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json CompletionBuilder::response() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice{{"index", i},
                {"text", c.text},
                {"logprobs", want_logprobs_ && !c.logprobs.empty() ? c.logprobs : json(nullptr)},
                {"finish_reason", c.finish_reason}};
    if (prompt_logprobs_ >= 0) choice["prompt_logprobs"] = c.prompt_logprobs.is_null() ? json(nullptr) : c.prompt_logprobs;
    choices.push_back(std::move(choice));
  }
  return json{{"id", id_},       {"object", "text_completion"},   {"created", created_},
              {"model", model_}, {"choices", std::move(choices)}, {"usage", usage()}};
}

json CompletionBuilder::usage_chunk() const {
  return json{{"id", id_},       {"object", "text_completion"}, {"created", created_},
              {"model", model_}, {"choices", json::array()},    {"usage", usage()}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace troupe::cluster::openai
