#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "model/download.hpp"
#include "model/model_dir.hpp"
#include "model/sha256.hpp"
#include "tiny_model.hpp"

namespace troupe::model {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// A one-connection-at-a-time HTTP/1.1 responder on 127.0.0.1 serving fixed
// responses by path; unknown paths get 404.
class HttpServer {
 public:
  struct Response {
    int status = 200;
    std::string headers;          // extra header lines, each ending in \r\n
    std::string body;
    long long content_length = -1;  // announced length; -1 = body.size()
  };

  HttpServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd_, 8) != 0) {
      throw std::runtime_error("test server: bind/listen failed");
    }
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~HttpServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void set(const std::string& path, Response r) {
    std::lock_guard<std::mutex> lock(mu_);
    routes_[path] = std::move(r);
  }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      timeval tv{5, 0};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
      }
      const size_t sp1 = req.find(' '), sp2 = req.find(' ', sp1 + 1);
      const std::string path = sp1 == std::string::npos ? "" : req.substr(sp1 + 1, sp2 - sp1 - 1);
      Response r;
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(path);
        auto it = routes_.find(path);
        if (it != routes_.end()) r = it->second;
        else r = Response{404, "", "not found", -1};
      }
      std::string head = "HTTP/1.1 " + std::to_string(r.status) + (r.status < 300 ? " OK" : " Other") +
                         "\r\nContent-Length: " +
                         std::to_string(r.content_length >= 0 ? r.content_length : (long long)r.body.size()) +
                         "\r\nConnection: close\r\n" + r.headers + "\r\n";
      send_all(c, head);
      send_all(c, r.body);
      shutdown(c, SHUT_WR);
      close(c);
    }
  }
  static void send_all(int c, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, Response> routes_;
  std::vector<std::string> requests_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Serves the tiny random model as the Hub would serve "gpt2": small files
// directly with a git SHA-1 ETag, model.safetensors through a redirect that
// carries X-Linked-Etag / X-Linked-Size, as huggingface.co does for LFS files.
void serve_tiny(HttpServer& s, const std::string& name = "gpt2") {
  const std::string dir = test::tiny_model_dir();
  for (const char* f : {"config.json", "vocab.json", "merges.txt"}) {
    s.set("/" + name + "/resolve/main/" + f,
          {200, "ETag: \"0123456789abcdef0123456789abcdef01234567\"\r\n", slurp(dir + "/" + f), -1});
  }
  const std::string weights = slurp(dir + "/model.safetensors");
  s.set("/" + name + "/resolve/main/model.safetensors",
        {302,
         "Location: /cdn/blob\r\nX-Linked-Etag: \"" + Sha256::of(weights) + "\"\r\nX-Linked-Size: " +
             std::to_string(weights.size()) + "\r\nETag: \"abc\"\r\n",
         "", -1});
  s.set("/cdn/blob", {200, "ETag: \"d41d8cd98f00b204e9800998ecf8427e\"\r\n", weights, -1});
}

DownloadOptions quiet(const std::string& endpoint) {
  DownloadOptions o;
  o.endpoint = endpoint;
  o.progress = false;
  o.connect_timeout_s = 5;
  o.stall_timeout_s = 5;
  return o;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  return out;
}

std::string download_error(const std::string& name, const std::string& dir, const DownloadOptions& o) {
  try {
    download_model(name, dir, o);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(Sha256::of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256::of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256::of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(Sha256::of(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256 inc;
  for (size_t off = 0, step = 1; off < million.size(); off += step, step = step * 7 % 191 + 1) {
    inc.update(million.data() + off, std::min(step, million.size() - off));
  }
  EXPECT_EQ(inc.hex_digest(), Sha256::of(million));
}

TEST(Download, UnreachableEndpointFailsFastWithManualSteps) {
  int port;
  {
    HttpServer probe;  // a port that was free a moment ago and is closed now
    port = std::stoi(probe.url().substr(probe.url().rfind(':') + 1));
  }
  test::TempDir tmp;
  const std::string dir = tmp.file("gpt2");
  const auto start = std::chrono::steady_clock::now();
  const std::string e = download_error("gpt2", dir, quiet("http://127.0.0.1:" + std::to_string(port)));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 60.0) << "a refused connection must not be retried for minutes";
  EXPECT_HAS(e, "downloading gpt2 failed");
  for (const char* f : {"config.json", "vocab.json", "merges.txt", "model.safetensors"}) {
    EXPECT_HAS(e, "http://127.0.0.1:" + std::to_string(port) + "/gpt2/resolve/main/" + f);
  }
  EXPECT_HAS(e, "troupe init-model --out " + dir);
  EXPECT_FALSE(fs::exists(dir)) << "a failed download must leave nothing behind";
}

TEST(Download, FetchesAllFilesThroughRedirects) {
  HttpServer s;
  serve_tiny(s);
  test::TempDir tmp;
  const std::string dir = tmp.file("m");
  DownloadOptions o = quiet(s.url());
  o.progress = true;
  testing::internal::CaptureStderr();
  download_model("gpt2", dir, o);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_HAS(err, "model.safetensors");
  EXPECT_HAS(err, "MB/s");
  EXPECT_HAS(err, "100.0%");
  for (const char* f : {"config.json", "vocab.json", "merges.txt", "model.safetensors"}) {
    EXPECT_EQ(slurp(dir + "/" + f), slurp(test::tiny_model_dir() + "/" + f)) << f;
  }
  EXPECT_EQ(files_in(dir).size(), 4u);
  testing::internal::CaptureStderr();
  const ModelDir m = load_model_dir(dir);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(m.config.n_layer, 2);
}

TEST(Download, EndpointFromEnvironmentAndCommunityName) {
  HttpServer s;
  serve_tiny(s, "openai-community/gpt2");
  test::TempDir tmp;
  setenv("TROUPE_HF_ENDPOINT", (s.url() + "/").c_str(), 1);
  DownloadOptions o = quiet("");
  EXPECT_EQ(download_error("openai-community/gpt2", tmp.path(), o), "");
  unsetenv("TROUPE_HF_ENDPOINT");
  EXPECT_TRUE(fs::is_regular_file(tmp.file("model.safetensors")));
}

TEST(Download, WrongHashLeavesNoFiles) {
  HttpServer s;
  serve_tiny(s);
  const std::string weights = slurp(test::tiny_model_dir() + "/model.safetensors");
  s.set("/gpt2/resolve/main/model.safetensors",
        {200, "X-Linked-Etag: \"" + std::string(64, 'a') + "\"\r\n", weights, -1});
  test::TempDir tmp;
  const std::string e = download_error("gpt2", tmp.path(), quiet(s.url()));
  EXPECT_HAS(e, "sha256");
  EXPECT_HAS(e, std::string(64, 'a'));
  EXPECT_HAS(e, Sha256::of(weights));
  EXPECT_TRUE(files_in(tmp.path()).empty());
}

TEST(Download, PlainEtagSha256IsCheckedToo) {
  HttpServer s;
  serve_tiny(s);
  s.set("/gpt2/resolve/main/model.safetensors",
        {200, "ETag: \"" + Sha256::of("something else") + "\"\r\n", "payload", -1});
  test::TempDir tmp;
  EXPECT_HAS(download_error("gpt2", tmp.path(), quiet(s.url())), "sha256");
  s.set("/gpt2/resolve/main/model.safetensors",
        {200, "ETag: \"" + Sha256::of("payload") + "\"\r\n", "payload", -1});
  EXPECT_EQ(download_error("gpt2", tmp.path(), quiet(s.url())), "");
  EXPECT_EQ(slurp(tmp.file("model.safetensors")), "payload");
}

TEST(Download, ShortBodyLeavesNoFiles) {
  HttpServer s;
  serve_tiny(s);
  s.set("/gpt2/resolve/main/model.safetensors", {200, "", std::string(1000, 'x'), 5000});
  test::TempDir tmp;
  const std::string e = download_error("gpt2", tmp.path(), quiet(s.url()));
  EXPECT_HAS(e, "model.safetensors");
  EXPECT_TRUE(files_in(tmp.path()).empty());

  s.set("/gpt2/resolve/main/model.safetensors", {200, "X-Linked-Size: 999\r\n", std::string(1000, 'x'), -1});
  EXPECT_HAS(download_error("gpt2", tmp.path(), quiet(s.url())), "X-Linked-Size said 999");
  EXPECT_TRUE(files_in(tmp.path()).empty());
}

TEST(Download, HttpErrorNamesStatusAndUrl) {
  HttpServer s;
  test::TempDir tmp;
  const std::string e = download_error("gpt2-xl", tmp.path(), quiet(s.url()));
  EXPECT_HAS(e, "HTTP 404");
  EXPECT_HAS(e, s.url() + "/gpt2-xl/resolve/main/config.json");
  EXPECT_EQ(s.requests().size(), 1u) << "fails at the first file";
}

TEST(Download, RejectsANonGpt2RepositoryBeforeTheBigFile) {
  HttpServer s;
  serve_tiny(s);
  s.set("/gpt2/resolve/main/config.json",
        {200, "", R"({"model_type":"llama","n_layer":2,"n_head":2,"n_embd":8,"n_positions":8,"vocab_size":10,"layer_norm_epsilon":1e-5})",
         -1});
  test::TempDir tmp;
  EXPECT_HAS(download_error("gpt2", tmp.path(), quiet(s.url())), "model_type");
  for (const auto& r : s.requests()) EXPECT_EQ(r.find("model.safetensors"), std::string::npos) << r;
  EXPECT_TRUE(files_in(tmp.path()).empty());
}

TEST(Download, FailureKeepsAnOlderModelIntact) {
  test::TempDir tmp;
  write_random_model(tmp.path(), Gpt2Config::preset("tiny"), 9, test::tokenizer_dir());
  const std::string config = slurp(tmp.file("config.json"));
  HttpServer s;
  serve_tiny(s);
  s.set("/gpt2/resolve/main/model.safetensors", {500, "", "oops", -1});
  EXPECT_HAS(download_error("gpt2", tmp.path(), quiet(s.url())), "HTTP 500");
  EXPECT_EQ(slurp(tmp.file("config.json")), config);
  EXPECT_EQ(files_in(tmp.path()).size(), 4u);
}

TEST(Download, UnknownModelIsACallerMistake) {
  test::TempDir tmp;
  try {
    download_model("llama-7b", tmp.path(), quiet("http://127.0.0.1:1"));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_HAS(std::string(e.what()), "gpt2-medium");
  }
  EXPECT_EQ(hub_file_url("https://h.co/", "gpt2", "main", "vocab.json"),
            "https://h.co/gpt2/resolve/main/vocab.json");
}

}  // namespace
}  // namespace troupe::model
