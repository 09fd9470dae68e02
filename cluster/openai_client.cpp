#include "cluster/openai_client.hpp"

#include <httplib.h>

#include <stdexcept>

namespace troupe::cluster {

using nlohmann::json;

std::vector<std::string> SseParser::feed(const char* data, size_t size) {
  std::vector<std::string> events;
  auto end_line = [&] {
    if (line_.empty()) {  // a blank line dispatches the event
      if (has_data_) events.push_back(data_);
      data_.clear();
      has_data_ = false;
    } else if (line_.compare(0, 5, "data:") == 0) {
      std::string v = line_.substr(5);
      if (!v.empty() && v[0] == ' ') v.erase(0, 1);
      if (has_data_) data_ += '\n';
      data_ += v;
      has_data_ = true;
    }  // comments and other fields (event:, id:, retry:) are not used here
    line_.clear();
  };
  for (size_t i = 0; i < size; ++i) {
    const char c = data[i];
    if (c == '\n') {
      if (!after_cr_) end_line();
      after_cr_ = false;
    } else if (c == '\r') {
      end_line();
      after_cr_ = true;
    } else {
      after_cr_ = false;
      line_ += c;
    }
  }
  return events;
}

std::string server_origin(const std::string& base_url) {
  std::string u = base_url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  if (u.size() >= 3 && u.compare(u.size() - 3, 3, "/v1") == 0) u.resize(u.size() - 3);
  if (u.rfind("http://", 0) != 0 && u.rfind("https://", 0) != 0) {
    throw std::invalid_argument("--base-url '" + base_url + "': expected http://HOST:PORT");
  }
  const size_t host_at = u.find("://") + 3;
  if (u.find('/', host_at) != std::string::npos) {
    throw std::invalid_argument("--base-url '" + base_url + "': no path is allowed but a trailing /v1");
  }
  return u;
}

OpenAiClient::OpenAiClient(const std::string& base_url, const std::string& api_key,
                           std::chrono::seconds timeout)
    : http_(std::make_unique<httplib::Client>(server_origin(base_url))), api_key_(api_key) {
  if (!http_->is_valid()) throw std::invalid_argument("--base-url '" + base_url + "' is not a usable URL");
  http_->set_tcp_nodelay(true);
  http_->set_keep_alive(true);
  http_->set_connection_timeout(std::chrono::seconds(10));
  http_->set_read_timeout(timeout);
  http_->set_write_timeout(std::chrono::seconds(30));
  if (!api_key.empty()) http_->set_bearer_token_auth(api_key);
}

OpenAiClient::~OpenAiClient() = default;

StreamedCompletion OpenAiClient::stream(const json& body, const std::function<int64_t()>& now,
                                        const std::function<void()>& on_piece) {
  StreamedCompletion out;
  SseParser parser;
  std::string raw;  // the body of a non-200 answer
  bool done = false;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (out.status != 200) {
      raw.append(data, n);
      return raw.size() < (1u << 20);
    }
    const int64_t t = now();
    for (const std::string& ev : parser.feed(data, n)) {
      if (ev == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(ev, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        out.error = "a chunk is not JSON: " + ev.substr(0, 200);
        return false;
      }
      if (j.contains("error")) {
        out.error = "server error in the stream: " + j["error"].dump();
        continue;
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        if (auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) {
          out.prompt_tokens = p->get<int32_t>();
        }
        if (auto p = u->find("completion_tokens"); p != u->end() && p->is_number_integer()) {
          out.completion_tokens = p->get<int32_t>();
        }
      }
      auto c = j.find("choices");
      if (c == j.end() || !c->is_array() || c->empty()) continue;
      const json& ch = (*c)[0];
      if (auto f = ch.find("finish_reason"); f != ch.end() && f->is_string()) out.finish_reason = *f;
      if (auto tx = ch.find("text");
          tx != ch.end() && tx->is_string() && !tx->get_ref<const std::string&>().empty()) {
        out.text += tx->get_ref<const std::string&>();
        out.pieces.push_back(t);
        if (on_piece) on_piece();
      }
    }
    return true;
  };
  // A request the server never answered (no status line: a kept-alive
  // connection the server had closed, or a connect dropped from a full
  // accept backlog) is sent again on a new connection, twice at most; its
  // time still counts from the first try.
  bool sent = false;
  httplib::Error err = httplib::Error::Success;
  for (int attempt = 0; attempt < 3; ++attempt) {
    httplib::Response res;
    err = httplib::Error::Success;
    sent = http_->send(req, res, err);
    if (sent || out.status != 0 || !out.error.empty()) break;
    ++out.retries;
  }
  if (!sent && out.error.empty()) {
    out.error = out.status == 0 ? "cannot reach the server: " + httplib::to_string(err)
                                : "the stream broke: " + httplib::to_string(err);
  } else if (out.status != 200 && out.error.empty()) {
    json j = json::parse(raw, nullptr, false);
    std::string m = raw.substr(0, 300);
    if (!j.is_discarded() && j.contains("error") && j["error"].is_object() &&
        j["error"].contains("message")) {
      m = j["error"]["message"].dump();
    }
    out.error = "HTTP " + std::to_string(out.status) + ": " + m;
  } else if (out.error.empty() && !done) {
    out.error = "the stream ended without [DONE]";
  }
  return out;
}

std::vector<std::string> OpenAiClient::models() {
  auto res = http_->Get("/v1/models");
  if (!res) throw std::runtime_error("GET /v1/models: " + httplib::to_string(res.error()));
  if (res->status != 200) throw std::runtime_error("GET /v1/models: HTTP " + std::to_string(res->status));
  json j = json::parse(res->body, nullptr, false);
  std::vector<std::string> ids;
  if (!j.is_discarded() && j.contains("data") && j["data"].is_array()) {
    for (const auto& m : j["data"]) {
      if (m.contains("id") && m["id"].is_string()) ids.push_back(m["id"]);
    }
  }
  return ids;
}

}  // namespace troupe::cluster
