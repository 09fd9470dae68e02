#pragma once
// Tokenizer: GPT-2's byte-level BPE (Radford et al. 2019, §2.2; Sennrich et
// al. 2016, "Neural Machine Translation of Rare Words with Subword Units"),
// id-for-id the same as Hugging Face's GPT2Tokenizer and tiktoken's "gpt2".
//
// encode: "<|endoftext|>" in the text is the special id (50256), as Hugging
// Face splits added tokens out before BPE (tiktoken with allowed_special="all");
// the text between is pre-tokenized by GPT-2's pattern (model/text/pretokenizer.hpp),
// each piece's bytes mapped to GPT-2's printable byte alphabet and merged by
// the lowest-ranked pair of merges.txt, all occurrences of a pair left to right
// per round (OpenAI's encoder.py), in O(n log n) for a piece of n bytes.
// decode: the tokens' bytes joined and read as UTF-8, each ill-formed part
// replaced by U+FFFD (Python's errors="replace"); no clean-up of spaces.
//
// Copies share one immutable vocabulary (cheap to copy); every method may be
// called from many threads at once (the BPE cache is sharded and locked).
// Torch-free (model/text/, troupe_text): RouterCore and the router actor use it.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::model {

class Tokenizer {
 public:
  // An empty tokenizer (no vocabulary): encode, decode, token_bytes and eos_id
  // throw std::logic_error; vocab_size() is 0 and valid_id() is false.
  Tokenizer();

  // Loads GPT-2's vocab.json (token text -> id, ids 0..n-1, text in GPT-2's
  // byte-to-unicode alphabet) and merges.txt ("#version" line, then one
  // "left right" pair per line, best first). Throws std::runtime_error naming
  // the file and what is wrong.
  static Tokenizer from_files(const std::string& vocab_json, const std::string& merges_txt);
  // dir/vocab.json + dir/merges.txt.
  static Tokenizer from_dir(const std::string& dir);

  // Ill-formed UTF-8 -> std::invalid_argument naming the byte offset.
  std::vector<int32_t> encode(std::string_view text) const;
  // Bytes -> UTF-8 with U+FFFD for ill-formed parts. An id outside
  // [0, vocab_size()) -> std::invalid_argument.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The raw bytes of one token (may be part of a UTF-8 character).
  std::string token_bytes(int32_t id) const;

  int32_t vocab_size() const;
  int32_t eos_id() const;  // "<|endoftext|>", 50256 for GPT-2
  bool valid_id(int32_t id) const;
  bool empty() const { return impl_ == nullptr; }

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  const Impl& impl() const;  // throws std::logic_error when empty
  std::shared_ptr<const Impl> impl_;
};

// Streaming decode: push ids one by one; each call returns only complete
// UTF-8 text, holding back a partial character until it completes. Bytes that
// can never complete a character come out as U+FFFD. flush() at the end
// returns what is held (a held partial character becomes U+FFFD). The text of
// all push() calls plus flush() equals tok.decode(all ids). Not thread-safe
// (one per stream); keeps a copy of the tokenizer.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok);
  std::string push(int32_t id);  // out-of-range id -> std::invalid_argument
  std::string flush();

 private:
  Tokenizer tok_;
  std::string pending_;  // bytes of an incomplete character (at most 3)
};

}  // namespace troupe::model
