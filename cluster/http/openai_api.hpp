#pragma once
// OpenAI's completions API (the legacy /v1/completions, as vLLM and
// llama.cpp's server speak it) mapped onto troupe's jobs and replies. Pure:
// JSON in, jobs out; replies in, JSON out. The HTTP front (http_front.hpp)
// does the sockets and threads.
//
// One HTTP request becomes prompts x n jobs; job (prompt p, choice c) has
// index p * n + c, which is its tag at the router and its `index` in the
// response (OpenAI's order). Meaning (lengths, ranges, the vocabulary) is
// checked by the router (actors::admit_job), like every front's jobs; this
// file checks only the JSON's shape and what troupe does not implement.
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "transport/protocol.hpp"

namespace troupe::model {
class Tokenizer;
}

namespace troupe::cluster::openai {

constexpr int32_t kMaxChoices = 256;  // prompts x n in one request, at most

// An error as OpenAI's clients expect it: HTTP status and
// {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // or "server_error"
  std::string param;                           // the offending field; "" = null
  std::string code;                            // e.g. "model_not_found"; "" = null
};
nlohmann::json to_json(const ApiError& error);
// The status and error of a job the router would not take: busy -> 429,
// invalid -> 400, too_long -> 413, no_workers / shutting_down -> 503.
ApiError from_rejected(const transport::Rejected& rejected);

struct CompletionRequest {
  std::vector<transport::Submit> jobs;  // jobs[i].tag == i
  int32_t n = 1;                        // choices per prompt
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  // echo: each choice's text (and, with logprobs, its logprobs) starts with
  // its prompt's, the first prompt token's logprob null (OpenAI's legacy
  // shape). The jobs then ask for the prompt's logprobs (prompt_logprobs).
  bool echo = false;
  int32_t logprobs = -1;         // the request's `logprobs` (top alternatives per token); -1 = none
  int32_t prompt_logprobs = -1;  // vLLM's prompt_logprobs: each choice's prompt_logprobs list; -1 = none
};

// Parses a /v1/completions body. `served_model`: a request naming another
// model is refused (404). With a seed s, choice c of every prompt gets
// seed_for_choice(s, c): choice 0 keeps s, so n = 1 and n = 3 agree on it.
std::variant<CompletionRequest, ApiError> parse_completion_request(const std::string& body,
                                                                   const std::string& served_model);
uint64_t seed_for_choice(uint64_t seed, int32_t choice);

// OpenAI's finish_reason for troupe's: eos and stop -> "stop", length ->
// "length", cancelled -> "abort" (vLLM's word), error -> "error".
const char* finish_reason_name(core::FinishReason reason);

// A request's choices as the router's replies come in: one SSE chunk per
// reply (streaming) or the whole response at the end. Not thread-safe.
class CompletionBuilder {
 public:
  // `tokenizer` (for the logprobs' token strings) must outlive the builder.
  CompletionBuilder(const CompletionRequest& request, std::string id, int64_t created_unix, std::string model,
                    const model::Tokenizer& tokenizer);

  // The chunk for one reply about choice `tag` (nullopt for one that says
  // nothing, or a tag that is not ours).
  std::optional<nlohmann::json> on_tokens(const transport::Tokens& tokens);
  std::optional<nlohmann::json> on_finished(const transport::Finished& finished);

  bool done() const { return remaining_ == 0; }
  // A choice that failed (finish_reason error): the request failed.
  const std::optional<ApiError>& failure() const { return failure_; }
  // After done(): the non-streaming response.
  nlohmann::json response() const;
  // After done(): the streaming usage chunk (choices empty).
  nlohmann::json usage_chunk() const;

 private:
  struct Choice {
    std::string echo;     // the prompt's text, shown before the completion (echo)
    bool echoed = false;  // echo shown (with the first chunk)
    nlohmann::json prompt_logprobs;  // vLLM's list: null, then {"id": {logprob, rank, decoded_token}} per token
    std::string text;
    bool finished = false;
    std::string finish_reason;
    transport::Finished last;
    nlohmann::json logprobs = nlohmann::json::object();  // tokens, token_logprobs, top_logprobs, text_offset
    int64_t text_offset = 0;                             // characters of the tokens so far
  };
  nlohmann::json chunk(size_t index, const std::string& text, nlohmann::json logprobs,
                       nlohmann::json finish_reason) const;
  nlohmann::json logprobs_of(Choice& c, const transport::Tokens& tokens);
  // The prompt's part of a choice (the router's first Tokens of a job with
  // prompt logprobs): echo's tokens and logprobs, vLLM's prompt_logprobs.
  nlohmann::json prompt_part(Choice& c, const transport::Tokens& tokens);
  // Appends a legacy logprobs part to the choice's own.
  static void append_logprobs(Choice& c, const nlohmann::json& part);
  nlohmann::json usage() const;

  std::string id_, model_;
  int64_t created_;
  bool include_usage_, want_logprobs_, echo_;
  int32_t logprobs_, prompt_logprobs_;
  int32_t n_;
  const model::Tokenizer& tokenizer_;
  std::vector<Choice> choices_;
  size_t remaining_;
  std::optional<ApiError> failure_;
};

// A JSON value as one line of text (invalid UTF-8 replaced, never thrown).
std::string dump(const nlohmann::json& j);

}  // namespace troupe::cluster::openai
