#pragma once
// A client of OpenAI-compatible servers for the load generator: one
// streaming /v1/completions call at a time per object (cpp-httplib, a kept-
// alive connection), its Server-Sent Events read as they arrive.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace httplib {
class Client;
}

namespace troupe::cluster {

// Server-Sent Events (WHATWG HTML, "server-sent events"): bytes in, the data
// of each complete event out. Lines are split at \n, \r\n or \r; "data:"
// lines of one event are joined with \n; comments (":...") and other fields
// are skipped; an event ends at a blank line.
class SseParser {
 public:
  std::vector<std::string> feed(const char* data, size_t size);

 private:
  std::string line_, data_;
  bool has_data_ = false, after_cr_ = false;
};

struct StreamedCompletion {
  int status = 0;               // HTTP status; 0 = no response (connection failed)
  std::string error;            // why it failed ("" = it succeeded)
  std::vector<int64_t> pieces;  // arrival (ns on the caller's clock) of each chunk with text
  std::string text;
  std::optional<int32_t> prompt_tokens, completion_tokens;  // the server's usage, when it gave one
  std::string finish_reason;
  int32_t retries = 0;  // sends repeated because the server had not answered at all
};

class OpenAiClient {
 public:
  // base_url: http[s]://HOST:PORT, optionally ending in /v1.
  OpenAiClient(const std::string& base_url, const std::string& api_key, std::chrono::seconds timeout);
  ~OpenAiClient();
  OpenAiClient(const OpenAiClient&) = delete;
  OpenAiClient& operator=(const OpenAiClient&) = delete;

  // POSTs `body` (stream: true is the caller's) to /v1/completions; `now`
  // stamps each piece; on_piece runs after each. Never throws for what the
  // server does: failures land in `error`.
  StreamedCompletion stream(const nlohmann::json& body, const std::function<int64_t()>& now,
                            const std::function<void()>& on_piece = {});
  // The ids of GET /v1/models; std::runtime_error when the server does not answer.
  std::vector<std::string> models();

 private:
  std::unique_ptr<httplib::Client> http_;
  std::string api_key_;
};

// "http://h:p/v1/" -> "http://h:p" (what httplib::Client takes).
std::string server_origin(const std::string& base_url);

}  // namespace troupe::cluster
