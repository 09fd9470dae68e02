#include "transport/field_reader.hpp"

#include <cmath>

namespace troupe::transport::detail {
namespace {

constexpr size_t kMaxEcho = 64;  // bytes of a peer's string quoted in a message

}  // namespace

void Failure::in(const std::string& outer) {
  if (path.empty() || path[0] == '[')
    path = outer + path;
  else
    path = outer + "." + path;
}

void bad(std::string problem) { throw Failure{ErrorCode::kBadField, "", std::move(problem)}; }
void malformed(std::string problem) { throw Failure{ErrorCode::kMalformed, "", std::move(problem)}; }

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, kMaxEcho)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > kMaxEcho) out += "...";
  return out;
}

std::string got(const R& r) { return std::string(", got ") + R::kind_name(r.peek()); }

uint64_t get_u64(R& r) {
  uint64_t v = 0;
  if (r.read_uint(v)) return v;
  int64_t i = 0;
  if (r.peek() == R::Kind::kInt && r.read_int(i))
    bad("expected an unsigned integer, got " + std::to_string(i));
  bad("expected an unsigned integer" + got(r));
}

int64_t get_i64(R& r) {
  int64_t v = 0;
  if (r.read_int(v)) return v;
  uint64_t u = 0;
  if (r.peek() == R::Kind::kInt && r.read_uint(u))
    bad(std::to_string(u) + " is out of range (at most " + std::to_string(INT64_MAX) + ")");
  bad("expected an integer" + got(r));
}

double get_double(R& r) {
  double d = 0;
  if (!r.read_number(d)) bad("expected a number" + got(r));
  if (!std::isfinite(d)) bad("must be a finite number");
  return d;
}

float get_float(R& r) {
  const double d = get_double(r);
  if (std::abs(d) > std::numeric_limits<float>::max()) bad("is out of the range of a 32-bit float");
  return static_cast<float>(d);
}

float get_logprob(R& r) {
  double d = 0;
  if (!r.read_number(d)) bad("expected a number" + got(r));
  if (std::isnan(d) || d > 0) bad("a log-probability must be <= 0 (or -inf)");
  if (d < -std::numeric_limits<float>::max()) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(d);
}

bool get_bool(R& r) {
  bool b = false;
  if (!r.read_bool(b)) bad("expected true or false" + got(r));
  return b;
}

std::string get_str(R& r) {
  std::string_view s;
  if (!r.read_str(s)) bad("expected a string" + got(r));
  return std::string(s);
}

uint32_t get_array(R& r) {
  uint32_t n = 0;
  if (!r.read_array(n)) bad("expected an array" + got(r));
  return n;
}

std::vector<int32_t> get_ints(R& r) {
  const uint32_t n = get_array(r);
  std::vector<int32_t> out(n);  // n <= bytes left: at most 4 bytes of vector per frame byte
  for (uint32_t i = 0; i < n; ++i)
    out[i] = in("[" + std::to_string(i) + "]", [&] { return get_int<int32_t>(r); });
  return out;
}

uint32_t get_tuple(R& r, uint32_t min, const char* layout) {
  const uint32_t n = get_array(r);
  if (n < min) bad(std::string("expected ") + layout + ", got " + std::to_string(n) + " elements");
  return n;
}

void skip_rest(R& r, uint32_t n, uint32_t used) {
  for (uint32_t i = used; i < n; ++i) r.skip(kMaxDepth);
}

Fields::Fields(R& r, bool top_level) : base_(r) {
  uint32_t n = 0;
  if (!r.read_map(n)) {
    if (top_level) malformed("a frame must be a msgpack map" + got(r));
    bad("expected a map" + got(r));
  }
  if (n > kMaxKeys)
    malformed("a map with " + std::to_string(n) + " keys (at most " + std::to_string(kMaxKeys) + ")");
  entries_.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view key;
    if (!r.read_str(key)) malformed("a map key must be a string" + got(r));
    for (const auto& e : entries_)
      if (e.first == key) malformed("duplicate key \"" + printable(key) + "\"");
    entries_.emplace_back(key, r.offset());
    r.skip(kMaxDepth);
  }
}

std::optional<R> Fields::find(std::string_view key) const {
  for (const auto& e : entries_)
    if (e.first == key) return base_.at(e.second);
  return std::nullopt;
}

bool Fields::has(const char* key) const {
  auto r = find(key);
  return r && r->peek() != R::Kind::kNil;
}

}  // namespace troupe::transport::detail
