#include "cluster/loadgen/openai_client.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <thread>

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

namespace {

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw std::runtime_error("curl_global_init failed");
  });
}

void read_usage(const json& u, StreamedCompletion& out) {
  if (auto p = u.find("prompt_tokens"); p != u.end() && p->is_number_integer()) {
    out.prompt_tokens = p->get<int32_t>();
  }
  if (auto p = u.find("completion_tokens"); p != u.end() && p->is_number_integer()) {
    out.completion_tokens = p->get<int32_t>();
  }
}

}  // namespace

bool CompletionStream::feed(int status, const char* data, size_t n, int64_t t,
                            const std::function<void()>& on_piece) {
  received_ = received_ || n > 0;
  if (status != 200) {
    raw_.append(data, n);
    return raw_.size() < (1u << 20);
  }
  for (const std::string& ev : parser_.feed(data, n)) {
    if (ev == "[DONE]") {
      done_ = true;
      continue;
    }
    json j = json::parse(ev, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      out_.error = "a chunk is not JSON: " + ev.substr(0, 200);
      return false;
    }
    if (j.contains("error")) {
      out_.error = "server error in the stream: " + j["error"].dump();
      continue;
    }
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) read_usage(*u, out_);
    auto c = j.find("choices");
    if (c == j.end() || !c->is_array() || c->empty()) continue;
    const json& ch = (*c)[0];
    if (auto f = ch.find("finish_reason"); f != ch.end() && f->is_string()) out_.finish_reason = *f;
    if (auto tx = ch.find("text");
        tx != ch.end() && tx->is_string() && !tx->get_ref<const std::string&>().empty()) {
      out_.text += tx->get_ref<const std::string&>();
      out_.pieces.push_back(t);
      if (on_piece) on_piece();
    }
  }
  return true;
}

StreamedCompletion CompletionStream::finish(int status, const std::string& transport_error) {
  StreamedCompletion out = std::move(out_);
  out.status = status;
  if (!out.error.empty()) return out;  // what the body said comes first
  if (!transport_error.empty()) {
    out.error = status == 0 ? "cannot reach the server: " + transport_error
                            : "the stream broke: " + transport_error;
  } else if (status != 200) {
    json j = json::parse(raw_, nullptr, false);
    std::string m = raw_.substr(0, 300);
    if (!j.is_discarded() && j.contains("error") && j["error"].is_object() && j["error"].contains("message")) {
      m = j["error"]["message"].dump();
    }
    out.error = "HTTP " + std::to_string(status) + ": " + m;
  } else if (!done_) {
    out.error = "the stream ended without [DONE]";
  }
  return out;
}

struct OpenAiStreams::Transfer {
  OpenAiStreams* owner = nullptr;
  size_t id = 0;
  std::string body;  // libcurl reads it in place (CURLOPT_POSTFIELDS)
  int32_t retries = 0;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  CompletionStream stream;
  int status = 0;

  ~Transfer() {
    if (easy) curl_easy_cleanup(easy);
    curl_slist_free_all(headers);
  }
  int response_code() {
    if (status == 0) {
      long code = 0;
      curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
      status = static_cast<int>(code);
    }
    return status;
  }
  static size_t on_data(char* data, size_t, size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    OpenAiStreams& o = *t->owner;
    const size_t id = t->id;
    const bool keep = t->stream.feed(t->response_code(), data, n, o.now_(), [&] {
      if (o.on_piece_) o.on_piece_(id);
    });
    return keep ? n : 0;  // 0 ends the transfer with CURLE_WRITE_ERROR
  }
};

OpenAiStreams::OpenAiStreams(const std::string& base_url, const std::string& api_key,
                             std::chrono::seconds timeout, std::function<int64_t()> now,
                             std::function<void(size_t)> on_piece)
    : url_(server_origin(base_url) + "/v1/completions"),
      api_key_(api_key),
      timeout_(timeout),
      now_(std::move(now)),
      on_piece_(std::move(on_piece)) {
  curl_init_once();
  multi_ = curl_multi_init();
  if (!multi_) throw std::runtime_error("curl_multi_init failed");
  // Finished streams leave their connections for the next requests (kept
  // alive; a connection the server has closed meanwhile is replaced by libcurl).
  curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, 1024L);
}

OpenAiStreams::~OpenAiStreams() {
  for (auto& t : transfers_) curl_multi_remove_handle(multi_, t->easy);
  transfers_.clear();
  curl_multi_cleanup(multi_);
}

size_t OpenAiStreams::in_flight() const { return transfers_.size(); }

void OpenAiStreams::add(StreamRequest request) {
  auto t = std::make_unique<Transfer>();
  t->id = request.id;
  t->body = request.body.dump();
  start(std::move(t));
}

void OpenAiStreams::start(std::unique_ptr<Transfer> t) {
  t->owner = this;
  t->easy = curl_easy_init();
  if (!t->easy) throw std::runtime_error("curl_easy_init failed");
  for (const char* h : {"Content-Type: application/json", "Accept: text/event-stream",
                        "Expect:"}) {  // no 100-continue round trip for long prompts
    t->headers = curl_slist_append(t->headers, h);
  }
  if (!api_key_.empty()) {
    t->headers = curl_slist_append(t->headers, ("Authorization: Bearer " + api_key_).c_str());
  }
  CURL* e = t->easy;
  curl_easy_setopt(e, CURLOPT_URL, url_.c_str());
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->body.c_str());
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->body.size()));
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Transfer::on_data);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  if (getenv("TROUPE_CURL_VERBOSE")) curl_easy_setopt(e, CURLOPT_VERBOSE, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
  // A stream silent for `timeout` (under 1 byte/s over that long) fails.
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, static_cast<long>(timeout_.count()));
  if (curl_multi_add_handle(multi_, e) != CURLM_OK) throw std::runtime_error("curl_multi_add_handle failed");
  transfers_.push_back(std::move(t));
}

std::vector<std::pair<size_t, StreamedCompletion>> OpenAiStreams::poll(std::chrono::milliseconds wait) {
  std::vector<std::pair<size_t, StreamedCompletion>> ended;
  auto collect = [&] {
    int running = 0;
    curl_multi_perform(multi_, &running);
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi_, &left)) {
      if (m->msg != CURLMSG_DONE) continue;
      auto it = std::find_if(transfers_.begin(), transfers_.end(),
                             [&](const auto& t) { return t->easy == m->easy_handle; });
      if (it == transfers_.end()) continue;
      std::unique_ptr<Transfer> t = std::move(*it);
      transfers_.erase(it);
      const CURLcode code = m->data.result;  // read before the handle goes
      curl_multi_remove_handle(multi_, t->easy);
      const int status = t->response_code();
      if (code != CURLE_OK && status == 0 && !t->stream.received_anything() && t->retries < 2) {
        auto again = std::make_unique<Transfer>();
        again->id = t->id;
        again->body = std::move(t->body);
        again->retries = t->retries + 1;
        start(std::move(again));
        continue;
      }
      StreamedCompletion c = t->stream.finish(status, code == CURLE_OK ? "" : curl_easy_strerror(code));
      c.retries = t->retries;
      ended.emplace_back(t->id, std::move(c));
    }
  };
  collect();
  if (ended.empty() && !transfers_.empty()) {
    curl_multi_poll(multi_, nullptr, 0, static_cast<int>(wait.count()), nullptr);
    collect();
  } else if (ended.empty() && wait.count() > 0) {
    std::this_thread::sleep_for(wait);
  }
  return ended;
}

namespace {

size_t append_body(char* data, size_t, size_t n, void* user) {
  auto* s = static_cast<std::string*>(user);
  if (s->size() + n > (size_t{16} << 20)) return 0;
  s->append(data, n);
  return n;
}

}  // namespace

std::vector<std::string> list_models(const std::string& base_url, const std::string& api_key) {
  curl_init_once();
  const std::string url = server_origin(base_url) + "/v1/models";
  std::unique_ptr<CURL, void (*)(CURL*)> e(curl_easy_init(), curl_easy_cleanup);
  if (!e) throw std::runtime_error("curl_easy_init failed");
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(nullptr, curl_slist_free_all);
  if (!api_key.empty()) {
    headers.reset(curl_slist_append(nullptr, ("Authorization: Bearer " + api_key).c_str()));
  }
  std::string body;
  curl_easy_setopt(e.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(e.get(), CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(e.get(), CURLOPT_WRITEFUNCTION, &append_body);
  curl_easy_setopt(e.get(), CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(e.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e.get(), CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(e.get(), CURLOPT_TIMEOUT, 30L);
  const CURLcode code = curl_easy_perform(e.get());
  if (code != CURLE_OK) throw std::runtime_error("GET " + url + ": " + curl_easy_strerror(code));
  long status = 0;
  curl_easy_getinfo(e.get(), CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) throw std::runtime_error("GET " + url + ": HTTP " + std::to_string(status));
  json j = json::parse(body, nullptr, false);
  std::vector<std::string> ids;
  if (!j.is_discarded() && j.contains("data") && j["data"].is_array()) {
    for (const auto& m : j["data"]) {
      if (m.contains("id") && m["id"].is_string()) ids.push_back(m["id"]);
    }
  }
  return ids;
}

json post_completion(const std::string& base_url, const std::string& api_key, const json& body,
                     std::chrono::seconds timeout) {
  curl_init_once();
  const std::string url = server_origin(base_url) + "/v1/completions";
  std::unique_ptr<CURL, void (*)(CURL*)> e(curl_easy_init(), curl_easy_cleanup);
  if (!e) throw std::runtime_error("curl_easy_init failed");
  curl_slist* h = curl_slist_append(nullptr, "Content-Type: application/json");
  h = curl_slist_append(h, "Expect:");
  if (!api_key.empty()) h = curl_slist_append(h, ("Authorization: Bearer " + api_key).c_str());
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(h, curl_slist_free_all);
  const std::string sent = body.dump();
  std::string answer;
  curl_easy_setopt(e.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(e.get(), CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(e.get(), CURLOPT_POSTFIELDS, sent.c_str());
  curl_easy_setopt(e.get(), CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(sent.size()));
  curl_easy_setopt(e.get(), CURLOPT_WRITEFUNCTION, &append_body);
  curl_easy_setopt(e.get(), CURLOPT_WRITEDATA, &answer);
  curl_easy_setopt(e.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e.get(), CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(e.get(), CURLOPT_TIMEOUT, static_cast<long>(timeout.count()));
  const CURLcode code = curl_easy_perform(e.get());
  if (code != CURLE_OK) throw std::runtime_error("POST " + url + ": " + curl_easy_strerror(code));
  long status = 0;
  curl_easy_getinfo(e.get(), CURLINFO_RESPONSE_CODE, &status);
  json j = json::parse(answer, nullptr, false);
  if (status != 200) {
    const std::string why = !j.is_discarded() && j.contains("error") && j["error"].is_object() &&
                                    j["error"].contains("message") && j["error"]["message"].is_string()
                                ? j["error"]["message"].get<std::string>()
                                : answer.substr(0, 200);
    throw std::runtime_error("POST " + url + ": HTTP " + std::to_string(status) + ": " + why);
  }
  if (j.is_discarded()) throw std::runtime_error("POST " + url + ": the answer is not JSON");
  return j;
}

}  // namespace troupe::cluster
