#pragma once
// What a client asks the scheduler for, and what the scheduler tells it back.
// Plain data, torch-free: the router, the batcher and the simulator share it.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/sampling_params.hpp"

namespace troupe::core {

// One generation job: a single sequence (no n > 1, no beam search).
struct Request {
  uint64_t id = 0;                  // unique among unfinished requests; also the plan's seq_id
  std::vector<int32_t> prompt_ids;  // non-empty; every id in [0, vocab_size)
  std::vector<int32_t> output_ids;  // tokens generated before: a request resumed on another worker
                                    // (they are recomputed, never generated again); usually empty
  int32_t max_tokens = 16;          // tokens to generate at most, output_ids included; >= 1, or 0
                                    // when sampling.prompt_logprobs >= 0 (score the prompt, generate nothing)
  SamplingParams sampling;          // its `seed` field is ignored: see `seed`
  std::optional<uint64_t> seed;     // nullopt: the scheduler draws one from its own seeded counter
  bool ignore_eos = false;          // true: eos_id is an ordinary token
  int32_t priority = 0;             // lower is admitted first; equal priorities in arrival order
  // Prompt logprobs already delivered, for positions 1 .. prompt_scored (a
  // request moved from another worker: they are not sent again); 0 = none.
  int32_t prompt_scored = 0;
};

// Token counts of a finished request (OpenAI's `usage`).
struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // generated ids, eos included
  int32_t cached_tokens = 0;      // prompt tokens served from the prefix cache at first admission
};

// Why a request ended.
enum class FinishReason { kEos, kLength, kStop, kCancelled, kError };
// "eos", "length", "stop", "cancelled", "error".
const char* to_string(FinishReason reason);

enum class EventKind {
  kScheduled,  // first admitted to a step (queue time ends); usage.cached_tokens says the prefix hit
  kPromptLogprobs,  // logprobs of prompt tokens (prompt_logprobs >= 0): every position 1 .. prompt
                    // length - 1 exactly once, in order, over one or more events, before any kToken
  kToken,      // one generated token
  kFinished,   // the last event of the request
};

// A request's stream: kScheduled once, the prompt's logprobs when asked
// (kPromptLogprobs), one kToken per generated token, in order, then exactly
// one kFinished (also for a cancelled request).
struct RequestEvent {
  uint64_t request_id = 0;
  EventKind kind = EventKind::kToken;
  bool finished() const { return kind == EventKind::kFinished; }

  // kToken.
  int32_t token_id = -1;
  float logprob = 0.0f;                                 // when the request asked for logprobs
  std::vector<std::pair<int32_t, float>> top_logprobs;  // top-K alternatives, most likely first

  // kPromptLogprobs: the scores of prompt positions [prompt_start,
  // prompt_start + prompt_logprobs.size()); each entry's id is the prompt's
  // token there, its rank given.
  int32_t prompt_start = 0;
  std::vector<SampledToken> prompt_logprobs;

  // Text, filled in by output processing (actors::OutputText), empty from the
  // scheduler: kToken, what became safe to show; kFinished, what stop-string
  // matching held back, and the whole text.
  std::string text_delta;
  std::string text;

  // kFinished (and kScheduled: usage.cached_tokens).
  FinishReason finish_reason = FinishReason::kLength;
  std::string error;                // kError: what went wrong
  std::vector<int32_t> output_ids;  // every generated id
  Usage usage;
};

}  // namespace troupe::core
