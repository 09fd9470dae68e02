#include "transport/curve_keys.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <zmq.h>

namespace troupe::transport {
namespace {

constexpr size_t kZ85KeyChars = 40;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// One meaningful line of a key file.
struct KeyLine {
  std::string name;  // "public-key", "secret-key", or "" for a bare key
  std::string key;
};

// nullopt for blank and comment lines; throws for anything that is not a key line.
std::optional<KeyLine> parse_line(std::string_view raw, const std::string& path, int number) {
  std::string_view line = trim(raw);
  if (line.empty() || line.front() == '#') return std::nullopt;
  auto fail = [&](const std::string& why) {
    return std::runtime_error(path + ":" + std::to_string(number) + ": " + why);
  };
  for (const char* name : {"public-key", "secret-key"}) {
    if (line.rfind(name, 0) != 0) continue;
    std::string_view rest = trim(line.substr(std::strlen(name)));
    if (rest.empty() || rest.front() != '=') throw fail(std::string("expected `") + name + " = <key>`");
    std::string_view key = trim(rest.substr(1));
    if (!is_z85_key(key)) throw fail(std::string(name) + " is not a 40-character Z85 key");
    return KeyLine{name, std::string(key)};
  }
  if (is_z85_key(line)) return KeyLine{"", std::string(line)};
  throw fail("not a key line (expected `public-key = <key>` or a 40-character Z85 key)");
}

std::vector<KeyLine> read_key_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read key file " + path + ": " + std::strerror(errno));
  std::vector<KeyLine> lines;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number)
    if (auto k = parse_line(line, path, number)) lines.push_back(*k);
  return lines;
}

void write_file(int fd, const std::string& path, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error("cannot write " + path + ": " + why);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace

bool curve_available() { return zmq_has("curve") != 0; }

KeyPair generate_keypair() {
  char pub[kZ85KeyChars + 1] = {}, sec[kZ85KeyChars + 1] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    throw std::runtime_error(std::string("cannot make a CurveZMQ key pair: ") + zmq_strerror(zmq_errno()) +
                             " (is libzmq built with libsodium?)");
  return {pub, sec};
}

bool is_z85_key(std::string_view key) {
  if (key.size() != kZ85KeyChars) return false;
  const std::string copy(key);  // zmq_z85_decode wants a NUL-terminated string
  uint8_t bytes[32];
  return zmq_z85_decode(bytes, copy.c_str()) != nullptr;
}

std::string public_key_of(std::string_view secret_key) {
  if (!is_z85_key(secret_key)) throw std::invalid_argument("a CurveZMQ secret key is 40 Z85 characters");
  const std::string sec(secret_key);
  char pub[kZ85KeyChars + 1] = {};
  if (zmq_curve_public(pub, sec.c_str()) != 0)
    throw std::runtime_error(std::string("cannot derive a CurveZMQ public key: ") +
                             zmq_strerror(zmq_errno()));
  return pub;
}

void write_secret_key_file(const std::string& path, const KeyPair& keys) {
  if (!is_z85_key(keys.public_key) || !is_z85_key(keys.secret_key))
    throw std::invalid_argument("write_secret_key_file: keys must be 40-character Z85 strings");
  // O_EXCL: never replace a key by accident; 0600 before any byte is written.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) throw std::invalid_argument(path + " exists: remove it first to make a new key");
    throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  }
  ::fchmod(fd, 0600);
  write_file(fd, path,
             "# troupe CurveZMQ secret key: keep it private (mode 0600)\npublic-key = " + keys.public_key +
                 "\nsecret-key = " + keys.secret_key + "\n");
}

void write_public_key_file(const std::string& path, std::string_view public_key) {
  if (!is_z85_key(public_key))
    throw std::invalid_argument("write_public_key_file: the key must be a 40-character Z85 string");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  write_file(fd, path, "# troupe CurveZMQ public key\npublic-key = " + std::string(public_key) + "\n");
}

KeyPair read_secret_key_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error("cannot read key file " + path + ": " + std::strerror(errno));
  if (st.st_mode & 077) {
    std::ostringstream mode;
    mode << std::oct << (st.st_mode & 0777);
    throw std::runtime_error("secret key file " + path + " may be read by others (mode 0" + mode.str() +
                             "): run chmod 600 " + path);
  }
  KeyPair keys;
  for (const KeyLine& l : read_key_lines(path)) {
    if (l.name == "public-key") keys.public_key = l.key;
    if (l.name == "secret-key") keys.secret_key = l.key;
  }
  if (keys.secret_key.empty()) throw std::runtime_error(path + " holds no `secret-key = ...` line");
  const std::string derived = public_key_of(keys.secret_key);
  if (keys.public_key.empty()) keys.public_key = derived;
  if (keys.public_key != derived)
    throw std::runtime_error(path + ": its public-key does not belong to its secret-key");
  return keys;
}

std::vector<std::string> read_public_keys(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.path().extension() == ".pub") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::vector<std::string> keys;
  for (const std::string& file : files)
    for (const KeyLine& l : read_key_lines(file))
      if (l.name != "secret-key" && std::find(keys.begin(), keys.end(), l.key) == keys.end())
        keys.push_back(l.key);
  if (keys.empty()) throw std::runtime_error("no public key found in " + path);
  return keys;
}

std::string load_public_key(const std::string& key_or_path) {
  std::error_code ec;
  if (is_z85_key(key_or_path) && !std::filesystem::exists(key_or_path, ec)) return key_or_path;
  std::vector<std::string> keys = read_public_keys(key_or_path);
  if (keys.size() != 1)
    throw std::runtime_error(key_or_path + " holds " + std::to_string(keys.size()) +
                             " public keys; expected one");
  return keys[0];
}

std::optional<CurveClientKeys> client_keys(const std::string& secret_key_file, const std::string& server_key) {
  if (secret_key_file.empty() != server_key.empty())
    throw std::invalid_argument("CurveZMQ needs both --curve-secret-key (this client's keys) and --curve-server-key");
  if (secret_key_file.empty()) return std::nullopt;
  const KeyPair mine = read_secret_key_file(secret_key_file);
  return CurveClientKeys{mine.public_key, mine.secret_key, load_public_key(server_key)};
}

}  // namespace troupe::transport
