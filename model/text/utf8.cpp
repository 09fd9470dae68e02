#include "model/text/utf8.hpp"

namespace troupe::model::utf8 {

namespace {

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

Sequence next_sequence(std::string_view s, size_t pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) return {Sequence::kComplete, 1};
  size_t need;                         // total length of the character b0 starts
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Sequence::kInvalid, 1};  // 80..C1 and F5..FF never start a character
  }
  size_t len = 1;
  while (len < need) {
    if (pos + len >= s.size()) return {Sequence::kIncomplete, len};
    const auto b = static_cast<unsigned char>(s[pos + len]);
    const bool ok = len == 1 ? (b >= lo && b <= hi) : is_cont(b);
    if (!ok) return {Sequence::kInvalid, len};
    ++len;
  }
  return {Sequence::kComplete, need};
}

size_t find_invalid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Sequence seq = next_sequence(s, pos);
    if (seq.kind != Sequence::kComplete) return pos;
    pos += seq.length;
  }
  return std::string_view::npos;
}

size_t decode_replace(std::string_view bytes, bool final, std::string& out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Sequence seq = next_sequence(bytes, pos);
    switch (seq.kind) {
      case Sequence::kComplete:
        out.append(bytes.data() + pos, seq.length);
        break;
      case Sequence::kInvalid:
        out.append(kReplacement);
        break;
      case Sequence::kIncomplete:
        if (!final) return pos;
        out.append(kReplacement);
        break;
    }
    pos += seq.length;
  }
  return pos;
}

}  // namespace troupe::model::utf8
