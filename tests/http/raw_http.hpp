#pragma once
// HTTP/1.1 at the byte level, for tests that behave as no library client
// would: slow, pipelined, half-closed, oversized, or merely many.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::test::raw {

// Raises the soft limit on open files to the hard one (many connections at once).
inline rlim_t raise_file_limit() {
  rlimit l{};
  ::getrlimit(RLIMIT_NOFILE, &l);
  if (l.rlim_cur < l.rlim_max) {
    l.rlim_cur = l.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &l);
  }
  ::getrlimit(RLIMIT_NOFILE, &l);
  return l.rlim_cur;
}

// A connected TCP socket to "HOST:PORT" (IPv4); -1 on failure.
inline int connect_to(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &a.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

inline bool send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

inline std::string post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}
inline std::string get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: t\r\n" + extra + "\r\n";
}

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // de-chunked
};

// Parses whole responses from the front of `in` (consumed as they are
// parsed). Interim (1xx) responses are skipped, as HTTP/1.1 clients must.
class Parser {
 public:
  void feed(const char* data, size_t n) { in_.append(data, n); }
  // The next whole response, if `in` holds one.
  std::optional<Response> next() {
    for (;;) {
      const size_t end = in_.find("\r\n\r\n");
      if (end == std::string::npos) return std::nullopt;
      Response r;
      const std::string head = in_.substr(0, end);
      r.status = std::atoi(head.c_str() + head.find(' ') + 1);
      size_t pos = head.find("\r\n");
      while (pos != std::string::npos && pos < head.size()) {
        const size_t next = head.find("\r\n", pos + 2);
        const std::string line =
            head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          std::string name = line.substr(0, colon);
          for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
        }
        pos = next;
      }
      size_t at = end + 4;
      if (r.status >= 100 && r.status < 200) {
        in_.erase(0, at);
        continue;
      }
      if (r.headers.count("content-length")) {
        const size_t len = std::stoul(r.headers["content-length"]);
        if (in_.size() < at + len) return std::nullopt;
        r.body = in_.substr(at, len);
        in_.erase(0, at + len);
        return r;
      }
      if (r.headers["transfer-encoding"] == "chunked") {
        for (;;) {
          const size_t nl = in_.find("\r\n", at);
          if (nl == std::string::npos) return std::nullopt;
          const size_t size = std::stoul(in_.substr(at, nl - at), nullptr, 16);
          if (in_.size() < nl + 2 + size + 2) return std::nullopt;
          r.body += in_.substr(nl + 2, size);
          at = nl + 2 + size + 2;
          if (size == 0) {
            in_.erase(0, at);
            return r;
          }
        }
      }
      if (!closed_) return std::nullopt;  // the body ends with the connection
      r.body = in_.substr(at);
      in_.clear();
      return r;
    }
  }
  void closed() { closed_ = true; }
  const std::string& pending() const { return in_; }

 private:
  std::string in_;
  bool closed_ = false;
};

// Reads `n` responses from `fd` (or fewer: the connection ended, or `timeout` passed).
inline std::vector<Response> read_responses(int fd, size_t n, std::chrono::milliseconds timeout) {
  std::vector<Response> out;
  Parser p;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[65536];
  while (out.size() < n) {
    while (out.size() < n) {
      auto r = p.next();
      if (!r) break;
      out.push_back(std::move(*r));
    }
    if (out.size() == n) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) != 1) break;
    const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    if (got <= 0) {
      p.closed();
      if (auto r = p.next()) out.push_back(std::move(*r));
      break;
    }
    p.feed(buf, static_cast<size_t>(got));
  }
  return out;
}

// Whether the peer closed `fd` within `timeout` (recv returns 0 or an error; data is read and dropped).
inline bool closed_within(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) != 1) return false;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
}

}  // namespace troupe::test::raw
