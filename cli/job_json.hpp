#pragma once
// A job as one JSON line of `troupe batch` / `troupe submit --input`:
// {"id", "prompt" | "prompt_ids", "max_tokens", "temperature", "top_k",
// "top_p", "seed", "stop", "logprobs", "ignore_eos", "presence_penalty",
// "frequency_penalty", "logit_bias" ({"id": bias}), "repetition_penalty",
// "priority"}. Parsed
// strictly: an unknown field, a wrong type or a number outside its field's
// range is an error naming the field and the value, never narrowed. What the
// values mean together (lengths, the vocabulary) is the router's check
// (actors::admit_job), shared with the servers.
#include <nlohmann/json.hpp>

#include "transport/protocol.hpp"

namespace troupe::cli {

// std::invalid_argument on any defect. `tag` is left 0.
transport::Submit parse_job_json(const nlohmann::json& line);

}  // namespace troupe::cli
