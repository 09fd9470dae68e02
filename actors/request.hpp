#pragma once
// What a client asks the scheduler for, and what the scheduler tells it back.
// Plain data, torch-free: the batcher, the router and the simulator share it.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/step_plan.hpp"

namespace troupe::actors {

// One generation job: a single sequence (no n > 1, no beam search).
struct Request {
  uint64_t id = 0;                    // unique among unfinished requests; also the plan's seq_id
  std::vector<int32_t> prompt_ids;    // non-empty; every id in [0, vocab_size)
  int32_t max_tokens = 16;            // tokens to generate at most; >= 1
  model::SamplingParams sampling;     // its `seed` field is ignored: see `seed`
  std::optional<uint64_t> seed;       // nullopt: the scheduler draws one from its own seeded counter
  std::vector<std::string> stop;      // stop strings (need a tokenizer); text ends before the first match
  bool ignore_eos = false;            // true: eos_id is an ordinary token
  int32_t priority = 0;               // lower is admitted first; equal priorities in arrival order
};

// Token counts of a finished request (OpenAI's `usage`).
struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // generated ids, eos included
  int32_t cached_tokens = 0;      // prompt tokens served from the prefix cache at first admission
};

// Why a request ended.
enum class FinishReason { kEos, kLength, kStop, kCancelled };
// "eos", "length", "stop", "cancelled".
const char* to_string(FinishReason reason);

// A request's stream: one token event per generated token, in order, then
// exactly one final event (also for a cancelled request).
struct RequestEvent {
  uint64_t request_id = 0;
  bool finished = false;  // false: a token event; true: the final event

  // Token events.
  int32_t token_id = -1;
  float logprob = 0.0f;                                // when the request asked for logprobs
  std::vector<std::pair<int32_t, float>> top_logprobs;  // top-K alternatives, most likely first

  // Both kinds: text that became safe to show with this event (empty without a
  // tokenizer). A final event carries what stop-string matching held back.
  std::string text_delta;

  // Final event.
  FinishReason finish_reason = FinishReason::kLength;
  std::vector<int32_t> output_ids;  // every generated id
  std::string text;                 // the whole generated text, cut before a matched stop string
  Usage usage;
};

}  // namespace troupe::actors
