#pragma once
// GPT-2's pre-tokenizer: splits text into the pieces that byte-level BPE then
// encodes one by one (Radford et al. 2019, "Language Models are Unsupervised
// Multitask Learners", §2.2; OpenAI's gpt-2/src/encoder.py).
#include <string_view>
#include <vector>

namespace troupe::model {

// Splits `text` by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as Python's `regex` module does (which Hugging Face's GPT2Tokenizer uses):
// contractions are case-sensitive and take only the ASCII apostrophe; \s is
// Unicode White_Space; \p{L} and \p{N} follow Unicode 17.0 even where the
// system PCRE2 has older tables. Returns views into `text`, in order, that
// together cover it. `text` must be well-formed UTF-8 (not checked here).
// Thread-safe.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace troupe::model
