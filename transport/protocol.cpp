#include "transport/protocol.hpp"

#include "transport/message_types.hpp"

namespace troupe::transport {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kMalformed:
      return "malformed";
    case ErrorCode::kBadVersion:
      return "bad_version";
    case ErrorCode::kUnknownType:
      return "unknown_type";
    case ErrorCode::kBadField:
      return "bad_field";
    case ErrorCode::kTooLarge:
      return "too_large";
    case ErrorCode::kUnexpected:
      return "unexpected";
    case ErrorCode::kTooSlow:
      return "too_slow";
  }
  return "unknown";
}

const char* to_string(RejectCode code) {
  switch (code) {
    case RejectCode::kBusy:
      return "busy";
    case RejectCode::kInvalid:
      return "invalid";
    case RejectCode::kTooLong:
      return "too_long";
    case RejectCode::kNoWorkers:
      return "no_workers";
    case RejectCode::kShuttingDown:
      return "shutting_down";
  }
  return "unknown";
}

const char* type_name(const Message& message) { return kMessageTypes[message.index()]; }

Error error_reply(const DecodeError& error) { return Error{error.code, error.message, error.tag}; }

}  // namespace troupe::transport
