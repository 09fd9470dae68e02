#pragma once
// Whole numbers from text (environment variables, failpoint specs): digits
// only, all of them, below 2^64 — no sign, no spaces, no suffix.
#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe::core {

// `text` as a whole number 0..2^64-1, or nothing when it is anything else.
inline std::optional<uint64_t> parse_whole_number(std::string_view text) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace troupe::core
