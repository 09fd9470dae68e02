#pragma once
// Typed, bounded reading of msgpack values into C++ fields, for decode()
// (internal to transport/). Every get_* consumes one value or throws a
// Failure naming the problem; `in(name, ...)` prefixes the key path on the
// way out, so decode() can say "submit.stop[2]: expected a string, got an
// integer". Structural problems come out of MsgpackReader as MsgpackError.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "transport/msgpack_reader.hpp"
#include "transport/protocol.hpp"

namespace troupe::transport::detail {

using R = MsgpackReader;

inline constexpr int kMaxDepth = 16;      // nesting of any value (ours reach 5)
inline constexpr uint32_t kMaxKeys = 64;  // keys of one map (ours have at most 19)

struct Failure {
  ErrorCode code;
  std::string path;  // "usage.prompt_tokens", "[2].id", ...
  std::string problem;

  void in(const std::string& outer);  // prefixes `outer` to the path
};

[[noreturn]] void bad(std::string problem);        // kBadField
[[noreturn]] void malformed(std::string problem);  // kMalformed

// A peer's string, safe to quote in a message or log line (printable ASCII, 64 bytes).
std::string printable(std::string_view s);
// ", got a string": the kind of the value at r, for messages.
std::string got(const R& r);

// Runs get() and prefixes the path of any failure with `name`.
template <class F>
auto in(const std::string& name, F&& get) -> decltype(get()) {
  try {
    return get();
  } catch (Failure& f) {
    f.in(name);
    throw;
  }
}

uint64_t get_u64(R& r);
int64_t get_i64(R& r);
double get_double(R& r);  // any number, finite
float get_float(R& r);    // any number, finite in float range
float get_logprob(R& r);  // <= 0, -inf allowed
bool get_bool(R& r);
std::string get_str(R& r);
uint32_t get_array(R& r);  // an array header; count <= bytes left
std::vector<int32_t> get_ints(R& r);

template <class T>
T get_int(R& r) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= 8);
  if constexpr (std::is_unsigned_v<T>) {
    const uint64_t v = get_u64(r);
    if (v > std::numeric_limits<T>::max())
      bad(std::to_string(v) + " is out of range (at most " + std::to_string(std::numeric_limits<T>::max()) +
          ")");
    return static_cast<T>(v);
  } else {
    const int64_t v = get_i64(r);
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
      bad(std::to_string(v) + " is out of range [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
          std::to_string(std::numeric_limits<T>::max()) + "]");
    return static_cast<T>(v);
  }
}

// An array whose elements get(r) reads. The reserve is capped: the count is
// a claim, and only the elements that are really there are stored.
template <class T, class F>
std::vector<T> get_list(R& r, F&& get) {
  const uint32_t n = get_array(r);
  std::vector<T> out;
  out.reserve(std::min<uint32_t>(n, 1u << 12));
  for (uint32_t i = 0; i < n; ++i) out.push_back(in("[" + std::to_string(i) + "]", [&] { return get(r); }));
  return out;
}

// A compact record: an array of at least `min` elements. More are a newer
// peer's additions; skip_rest() passes over them.
uint32_t get_tuple(R& r, uint32_t min, const char* layout);
void skip_rest(R& r, uint32_t n, uint32_t used);

// A string naming one of `values`, as its to_string() (found by ADL) names it.
template <class E, size_t N>
E get_enum(R& r, const std::array<E, N>& values) {
  std::string_view s;
  if (!r.read_str(s)) bad("expected a string" + got(r));
  std::string known;
  for (E value : values) {
    const char* name = to_string(value);
    if (s == name) return value;
    known += known.empty() ? name : std::string(", ") + name;
  }
  bad("unknown value \"" + printable(s) + "\" (one of " + known + ")");
}

// One msgpack map, its keys indexed on construction (duplicates, non-string
// keys and more than kMaxKeys keys are malformed), values read on demand.
class Fields {
 public:
  // Consumes the map at r. top_level: a frame that is not a map is malformed
  // (elsewhere a map of the wrong kind is a bad field).
  explicit Fields(R& r, bool top_level = false);

  std::optional<R> find(std::string_view key) const;  // nullopt when absent
  bool has(const char* key) const;                    // present and not nil

  // A value that must be there.
  template <class F>
  auto req(const char* key, F&& get) const {
    auto r = find(key);
    if (!r) throw Failure{ErrorCode::kBadField, key, "missing required key"};
    return in(key, [&] { return get(*r); });
  }
  // A value that may be absent or nil (then `out` keeps its default).
  template <class T, class F>
  void opt(const char* key, T& out, F&& get) const {
    auto r = find(key);
    if (!r || r->read_nil()) return;
    out = in(key, [&] { return get(*r); });
  }

 private:
  R base_;
  std::vector<std::pair<std::string_view, size_t>> entries_;  // key, offset of its value
};

}  // namespace troupe::transport::detail
