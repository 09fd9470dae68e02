#include "model/download.hpp"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "model/config.hpp"
#include "model/sha256.hpp"

namespace troupe::model {
namespace fs = std::filesystem;
namespace {

const char* const kFiles[] = {"config.json", "vocab.json", "merges.txt", "model.safetensors"};
const char* const kDefaultEndpoint = "https://huggingface.co";

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// An ETag value as a sha256 hex digest, or "" when it is not one (git blob
// ETags of small files are 40-hex SHA-1s; CDN ETags may be MD5s).
std::string etag_sha256(std::string v) {
  v = trim(v);
  if (v.rfind("W/", 0) == 0) v = v.substr(2);
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  v = lower(v);
  if (v.size() != 64) return "";
  for (char c : v) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return "";
  }
  return v;
}

std::string human_mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

// State of one transfer, shared with libcurl's callbacks.
struct Transfer {
  std::string file;           // name shown in the progress bar
  FILE* out = nullptr;
  Sha256 sha;
  curl_off_t written = 0;     // bytes of the body written
  bool write_failed = false;
  int responses = 0;          // HTTP responses seen (redirects included)
  std::string first_etag;     // ETag of the first response (the Hub's own)
  std::string linked_etag;    // X-Linked-Etag of any response (LFS sha256)
  curl_off_t linked_size = -1;  // X-Linked-Size of any response
  bool progress = false;
  bool tty = false;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw{};
};

size_t on_write(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (std::fwrite(data, 1, bytes, t->out) != bytes) {
    t->write_failed = true;
    return 0;  // makes libcurl stop with CURLE_WRITE_ERROR
  }
  t->sha.update(data, bytes);
  t->written += static_cast<curl_off_t>(bytes);
  return bytes;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    ++t->responses;
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  const std::string key = lower(trim(line.substr(0, colon)));
  const std::string value = trim(line.substr(colon + 1));
  if (key == "etag" && t->responses == 1) t->first_etag = value;
  if (key == "x-linked-etag") t->linked_etag = value;
  if (key == "x-linked-size") t->linked_size = std::strtoll(value.c_str(), nullptr, 10);
  return size * n;
}

void draw(Transfer& t, curl_off_t total, bool done) {
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - t.start).count();
  const double rate = secs > 0 ? static_cast<double>(t.written) / secs / 1e6 : 0.0;
  char pct[16] = "";
  std::string bar;
  if (total > 0) {
    const double f = std::min(1.0, static_cast<double>(t.written) / static_cast<double>(total));
    std::snprintf(pct, sizeof pct, "%5.1f%%", 100.0 * f);
    const int width = 24, full = static_cast<int>(f * width);
    bar = "[" + std::string(full, '#') + std::string(width - full, '.') + "] ";
  }
  std::fprintf(stderr, "%s  %-18s %s%s%s%s  %s  %.1f MB/s   %s", t.tty ? "\r" : "", t.file.c_str(),
               bar.c_str(), human_mb(static_cast<double>(t.written)).c_str(),
               total > 0 ? " / " : "", total > 0 ? human_mb(static_cast<double>(total)).c_str() : "",
               pct, rate, done || !t.tty ? "\n" : "");
  std::fflush(stderr);
  t.last_draw = now;
}

int on_progress(void* user, curl_off_t dltotal, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (!t->progress || !t->tty) return 0;
  if (std::chrono::steady_clock::now() - t->last_draw > std::chrono::milliseconds(200)) draw(*t, dltotal, false);
  return 0;
}

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw std::runtime_error("curl_global_init failed");
  });
}

// Downloads `url` to `part`, checked; removes `part` and throws
// std::runtime_error with the reason (no advice; the caller adds it) on failure.
void fetch_file(const std::string& url, const std::string& part, const std::string& file,
                const DownloadOptions& options) {
  Transfer t;
  t.file = file;
  t.progress = options.progress;
  t.tty = isatty(STDERR_FILENO) != 0;
  t.out = std::fopen(part.c_str(), "wb");
  if (!t.out) throw std::runtime_error("cannot create " + part);

  CURL* curl = curl_easy_init();
  if (!curl) {
    std::fclose(t.out);
    std::remove(part.c_str());
    throw std::runtime_error("curl_easy_init failed");
  }
  char errbuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(curl, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, options.connect_timeout_s);
  if (options.stall_timeout_s > 0) {
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, options.stall_timeout_s);
  }
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "troupe/0.1 (libcurl)");
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);

  const CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_off_t content_length = -1;
  curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &content_length);
  curl_easy_cleanup(curl);
  const bool closed = std::fclose(t.out) == 0;

  std::string error;
  if (rc == CURLE_HTTP_RETURNED_ERROR) {
    error = "HTTP " + std::to_string(status) + " for " + url +
            (status == 401 || status == 404 ? " (no such model, revision or file on this endpoint)" : "");
  } else if (rc != CURLE_OK) {
    error = url + ": " + (errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(rc)));
    if (t.write_failed) error = "cannot write " + part + " (disk full?)";
  } else if (!closed) {
    error = "cannot write " + part + " (disk full?)";
  } else if (content_length >= 0 && content_length != t.written) {
    error = url + ": got " + std::to_string(t.written) + " bytes but Content-Length said " +
            std::to_string(content_length);
  } else if (t.linked_size >= 0 && t.linked_size != t.written) {
    error = url + ": got " + std::to_string(t.written) + " bytes but X-Linked-Size said " +
            std::to_string(t.linked_size);
  } else {
    const std::string want = etag_sha256(t.linked_etag.empty() ? t.first_etag : t.linked_etag);
    if (!want.empty()) {
      const std::string got = t.sha.hex_digest();
      if (got != want) {
        error = url + ": sha256 " + got + " does not match " + want + " announced by the server";
      }
    }
  }
  if (!error.empty()) {
    if (t.progress && t.tty) std::fputc('\n', stderr);
    std::remove(part.c_str());
    throw std::runtime_error(error);
  }
  if (t.progress) draw(t, t.written, true);
}

}  // namespace

std::vector<std::string> downloadable_models() {
  return {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
}

std::string hub_file_url(const std::string& endpoint, const std::string& name,
                         const std::string& revision, const std::string& file) {
  std::string base = endpoint;
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base + "/" + name + "/resolve/" + revision + "/" + file;
}

void download_model(const std::string& name, const std::string& to_dir, const DownloadOptions& options) {
  const auto models = downloadable_models();
  const std::string bare = name.rfind("openai-community/", 0) == 0 ? name.substr(17) : name;
  if (std::find(models.begin(), models.end(), bare) == models.end()) {
    std::string list;
    for (const auto& m : models) list += (list.empty() ? "" : ", ") + m;
    throw std::invalid_argument("unknown model \"" + name + "\"; troupe can download: " + list +
                                " (also as openai-community/<name>)");
  }
  if (options.revision.empty()) throw std::invalid_argument("download revision must not be empty");
  std::string endpoint = options.endpoint;
  if (endpoint.empty()) {
    const char* env = std::getenv("TROUPE_HF_ENDPOINT");
    endpoint = env && *env ? env : kDefaultEndpoint;
  }

  auto by_hand = [&] {
    std::string s = "To get the model by hand, download these 4 files into " + to_dir + ":\n";
    for (const char* f : kFiles) s += "  " + hub_file_url(endpoint, name, options.revision, f) + "\n";
    s += "(e.g. `curl -L -o " + (fs::path(to_dir) / "model.safetensors").string() + " " +
         hub_file_url(endpoint, name, options.revision, "model.safetensors") +
         "`), or make a random model for tests with `troupe init-model --out " + to_dir +
         "` (its text is noise).";
    return s;
  };

  curl_init_once();
  std::error_code ec;
  const bool created = fs::create_directories(to_dir, ec);
  if (ec) throw std::runtime_error("cannot create " + to_dir + ": " + ec.message());

  // All four files land as .part first and are renamed together, so a failed
  // download never mixes new files with an older model's (say, init-model's
  // random weights under GPT-2's config).
  std::vector<std::string> parts;
  auto remove_parts = [&] {
    for (const auto& p : parts) std::remove(p.c_str());
    std::error_code ignored;
    if (created) fs::remove(to_dir, ignored);  // only when still empty
  };
  for (const char* f : kFiles) {
    const std::string part = (fs::path(to_dir) / f).string() + ".part";
    parts.push_back(part);
    try {
      fetch_file(hub_file_url(endpoint, name, options.revision, f), part, f, options);
      // Fail before the large download when the repository is not a GPT-2.
      if (std::string(f) == "config.json") Gpt2Config::from_json_file(part);
    } catch (const std::runtime_error& e) {
      remove_parts();
      throw std::runtime_error("downloading " + name + " failed: " + e.what() + "\n" + by_hand());
    }
  }
  // config.json last: a folder whose config.json is new is complete.
  for (size_t i = parts.size(); i-- > 0;) {
    const std::string path = (fs::path(to_dir) / kFiles[i]).string();
    fs::rename(parts[i], path, ec);
    if (ec) {
      remove_parts();
      throw std::runtime_error("cannot rename " + parts[i] + " to " + path + ": " + ec.message());
    }
  }
}

}  // namespace troupe::model
