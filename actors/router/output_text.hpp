#pragma once
// OutputText: a request's generated text, built token by token for streaming:
// incremental detokenisation (never half a UTF-8 character, model::
// IncrementalDecoder) followed by stop-string matching (model::StopMatcher:
// text that may start a stop string is held back; the text ends before a
// matched stop).
#include <cstdint>
#include <string>
#include <vector>

#include "model/text/stop_matcher.hpp"
#include "model/text/tokenizer.hpp"

namespace troupe::actors {

class OutputText {
 public:
  // `stops` must be non-empty strings; the tokenizer is copied (cheap, shared).
  OutputText(const model::Tokenizer& tokenizer, std::vector<std::string> stops);

  // The text that became safe with token `id` (empty once stopped).
  std::string push(int32_t id);
  // True once a stop string matched.
  bool stopped() const { return matcher_.matched(); }
  // End of generation: everything held back (nothing after a stop).
  std::string flush();
  // Everything returned by push() and flush() so far.
  const std::string& text() const { return text_; }

 private:
  model::IncrementalDecoder decoder_;
  model::StopMatcher matcher_;
  std::string text_;
};

}  // namespace troupe::actors
