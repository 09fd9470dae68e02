#pragma once
// The property that the decoder fuzzer (fuzz_decode.cpp) and the mutation
// smoke test (decode_smoke_test.cpp) check on any bytes at all:
//   - decode() returns (no throw, no crash, no sanitizer report);
//   - a failure has a known code and a non-empty message;
//   - a success re-encodes to a frame that decodes again, and encoding that
//     gives the same bytes (encode . decode is a fixed point after one step,
//     so nothing decode accepts is lost or changed by the next hop).
#include <optional>
#include <string>
#include <string_view>

#include "transport/protocol.hpp"

namespace troupe::transport::test {

// What is wrong, or nullopt. `code` receives the error code (for statistics).
inline std::optional<std::string> check_decode(std::string_view bytes, size_t max_frame_bytes,
                                               std::optional<ErrorCode>* code = nullptr) {
  Decoded d = decode(bytes, max_frame_bytes);
  if (!d.ok()) {
    if (code) *code = d.error.code;
    if (d.error.message.empty())
      return std::string("empty error message for code ") + to_string(d.error.code);
    if (std::string(to_string(d.error.code)) == "unknown") return std::string("unknown error code");
    return std::nullopt;
  }
  if (code) code->reset();
  const std::string once = encode(*d.message);
  Decoded again = decode(once, once.size());
  if (!again.ok())
    return std::string("re-encoded ") + type_name(*d.message) + " does not decode: " + again.error.message;
  if (encode(*again.message) != once) return std::string("re-encoded ") + type_name(*d.message) + " changed";
  return std::nullopt;
}

}  // namespace troupe::transport::test
