#pragma once
// A job as one JSON line of `troupe batch` / `troupe submit --input`:
// {"id", "prompt" | "prompt_ids", "max_tokens", "temperature", "top_k",
// "top_p", "seed", "stop", "logprobs", "ignore_eos", "presence_penalty",
// "frequency_penalty", "logit_bias" ({"id": bias}), "repetition_penalty",
// "priority", "echo", "prompt_logprobs"}. max_tokens may be 0 with echo or
// prompt_logprobs (the prompt is scored, nothing generated). Parsed
// strictly: an unknown field, a wrong type or a number outside its field's
// range is an error naming the field and the value, never narrowed. What the
// values mean together (lengths, the vocabulary) is the router's check
// (actors::admit_job), shared with the servers.
#include <nlohmann/json.hpp>

#include "transport/protocol.hpp"

namespace troupe::cli {

// One line, with what only the output uses.
struct JobLine {
  transport::Submit job;        // its prompt_logprobs covers what echo needs too
  bool echo = false;            // "echo": the output's text (and logprobs) start with the prompt's
  int32_t prompt_logprobs = -1;  // "prompt_logprobs" as asked: the output's list of them
};

// std::invalid_argument on any defect. `tag` is left 0.
JobLine parse_job_line(const nlohmann::json& line);
inline transport::Submit parse_job_json(const nlohmann::json& line) { return parse_job_line(line).job; }

// Adds the prompt's part to a finished job's output line `out` (its "text",
// "logprobs" of the generated tokens already there): with echo, "prompt_ids",
// the prompt's text before "text", and with logprobs the prompt's tokens
// before the generated ones (the first with a null logprob); with
// prompt_logprobs, "prompt_logprobs": [null, {"id", "logprob", "rank",
// "top"}, ...]. `scores` holds one per prompt_ids[1..] (fewer if the job
// failed before they all came).
void add_prompt_output(nlohmann::json& out, const JobLine& line, const std::vector<int32_t>& prompt_ids,
                       const std::string& prompt_text, const std::vector<core::SampledToken>& scores);

}  // namespace troupe::cli
