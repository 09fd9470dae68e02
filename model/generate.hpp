#pragma once
// The two reference generation loops of one prompt, kept on purpose: they are
// what `troupe generate --mode naive|kv` runs and the oracles the paged engine
// is tested against.
//
//  * kNaive: every step runs the whole sequence through forward_full, with no
//    cache: O(N^2) work for N tokens, nothing to get wrong.
//  * kKv:    one prefill of the prompt into a contiguous K/V cache
//    (forward_contiguous), then one token per step: O(N).
//
// Both sample the last row with the worker's sampler at position
// prompt_len + i for the i-th generated token, so for equal logits they pick
// the tokens the paged engine picks, seeded or greedy.
//
// The run ends at the first of: <|endoftext|> (finish "eos"; the id is kept in
// `ids`, its text is not), a stop string in the streamed text (finish "stop";
// `ids` keeps the token that completed it, `text` ends before it), or
// max_tokens ids (finish "length"). The same rules as the scheduler's.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "model/gpt2.hpp"
#include "model/sampler.hpp"
#include "model/text/tokenizer.hpp"

namespace troupe::model {

enum class GenerateMode {
  kNaive,  // recompute the whole sequence every step
  kKv,     // contiguous K/V cache
};

struct GenerateOptions {
  int32_t max_tokens = 16;         // ids to generate at most; >= 1
  SamplingParams sampling;         // temperature 0 = greedy; the seed keys every draw
  std::vector<std::string> stop;   // stop strings (non-empty); none = off
  bool ignore_eos = false;         // true: <|endoftext|> is an ordinary token
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;            // generated ids (the EOS id included when it ended the run)
  std::string text;                    // what on_text received: ids detokenised, no EOS, cut before a stop
  std::string finish_reason;           // "length" | "stop" | "eos"
  std::vector<SampledToken> logprobs;  // one per id when sampling.logprobs >= 0, else empty
  double prefill_ms = 0.0;             // start until the first id is sampled (prompt forward + sample)
  double decode_ms = 0.0;              // the remaining steps
};

// Generates from `prompt_ids`, streaming text deltas (never half a UTF-8
// character, never text that turns out to be a stop string) into on_text.
// Throws std::invalid_argument before any work when the prompt is empty,
// max_tokens < 1, prompt_len + max_tokens > n_positions, a prompt id is
// outside the vocabulary, a stop string is empty or the sampling params are
// invalid. `step_logits`, when given, receives the logits row [vocab] (CPU
// fp32) each id was sampled from (for tests and tools).
GenerateResult generate(const Gpt2& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt_ids,
                        const GenerateOptions& options, GenerateMode mode,
                        const std::function<void(const std::string& text_delta)>& on_text = {},
                        std::vector<torch::Tensor>* step_logits = nullptr);

const char* to_string(GenerateMode mode);  // "naive" | "kv"

}  // namespace troupe::model
