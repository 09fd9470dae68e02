#pragma once
// UTF-8 well-formedness (Unicode 15.0, Table 3-7) and decoding with U+FFFD
// replacement by "maximal subparts" (Unicode 15.0, §3.9, U+FFFD Substitution of
// Maximal Subparts), which is what Python's bytes.decode("utf-8",
// errors="replace") does, so decoded text matches Hugging Face's tokenizers.
#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::model::utf8 {

// U+FFFD REPLACEMENT CHARACTER, UTF-8 encoded.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// What the bytes at one position start.
struct Sequence {
  enum Kind {
    kComplete,    // a well-formed character of `length` bytes
    kInvalid,     // an ill-formed maximal subpart of `length` bytes (>= 1): one U+FFFD
    kIncomplete,  // a well-formed prefix of `length` bytes that runs into the end of the input
  };
  Kind kind;
  size_t length;
};

// Classifies the bytes of `s` starting at `pos` (< s.size()).
Sequence next_sequence(std::string_view s, size_t pos);

// Byte offset of the first ill-formed (or truncated) sequence, or npos when `s`
// is well-formed UTF-8. Overlongs, surrogates (ED A0..BF) and code points above
// U+10FFFF are ill-formed.
size_t find_invalid(std::string_view s);

// Appends the text of `bytes` to `out`, replacing each maximal ill-formed
// subpart by U+FFFD. When `final` is false a trailing incomplete character is
// not consumed; returns how many bytes were consumed.
size_t decode_replace(std::string_view bytes, bool final, std::string& out);

}  // namespace troupe::model::utf8
