#include "core/failpoints.hpp"

#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/splitmix.hpp"
#include "core/whole_number.hpp"

namespace troupe::fail {
namespace {

enum class Kind { kOff, kDrop, kError, kSleep, kHang, kCrash, kSpin };

// Which hits fire, by the failpoint's 1-based hit number n.
struct Trigger {
  enum Type { kEvery, kNth, kFrom, kRange, kPercent } type = kEvery;
  uint64_t first = 0;        // kNth, kFrom, kRange
  uint64_t last = 0;         // kRange, inclusive
  double probability = 1.0;  // kPercent, in (0, 1]
};

struct Entry {
  Kind kind = Kind::kOff;
  std::string spelled;  // the action as the log line names it: "sleep(2000)"
  std::string error;    // kError: the text handed to the caller
  uint64_t ms = 0;      // kSleep
  uint64_t us = 0;      // kSpin
  Trigger trigger;
  uint64_t stream = 0;  // kPercent: key of this entry's draws (seed, name, position)
};

constexpr uint64_t kMaxSleepMs = 86'400'000;  // a day; longer stalls are what hang is for
constexpr uint64_t kMaxSpinUs = 1'000'000;    // a second of one CPU

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return (c >= 'a' && c <= 'z') || is_digit(c) || c == '_' || c == '.'; }
bool is_word_char(char c) { return c >= 'a' && c <= 'z'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Reads one entry token by token (whitespace allowed between tokens); every
// refusal names the entry.
class EntryParser {
 public:
  explicit EntryParser(std::string_view entry) : s_(entry) {}

  std::pair<std::string, Entry> parse() {
    std::string name(take(is_name_char));
    if (name.empty() || !eat('=')) refuse("name=action with a name of [a-z0-9_.] characters");
    Entry e = action();
    if (eat('@')) e.trigger = trigger();
    skip_space();
    if (i_ != s_.size())
      refuse("'@trigger', ';' or the end after the action, got '" + std::string(s_.substr(i_)) + "'");
    return {std::move(name), std::move(e)};
  }

 private:
  [[noreturn]] void refuse(const std::string& expected) const {
    throw std::invalid_argument("failpoint entry '" + std::string(s_) + "': expected " + expected);
  }

  void skip_space() {
    while (i_ < s_.size() && is_space(s_[i_])) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ == s_.size() || s_[i_] != c) return false;
    ++i_;
    return true;
  }
  std::string_view take(bool (*accept)(char)) {
    skip_space();
    const size_t begin = i_;
    while (i_ < s_.size() && accept(s_[i_])) ++i_;
    return s_.substr(begin, i_ - begin);
  }
  uint64_t whole(const std::string& expected) { return whole(take(is_digit), expected); }
  // "(N)" after the action `word`, N a whole number 0..max in `unit`s; sets e.spelled.
  uint64_t bounded_argument(Entry& e, const std::string& word, const char* unit, uint64_t max) {
    const std::string form = word + "(" + unit + ") with " + unit + " a whole number 0.." + std::to_string(max);
    if (!eat('(')) refuse(form);
    const uint64_t v = whole(form);
    if (v > max || !eat(')')) refuse(form);
    e.spelled = word + "(" + std::to_string(v) + ")";
    return v;
  }
  // `digits` as a whole number below 2^64, or refuse(expected).
  uint64_t whole(std::string_view digits, const std::string& expected) const {
    const std::optional<uint64_t> v = core::parse_whole_number(digits);
    if (!v) refuse(expected);
    return *v;
  }

  Entry action() {
    const std::string word(take(is_word_char));
    Entry e;
    e.spelled = word;
    if (word == "off") {
      e.kind = Kind::kOff;
    } else if (word == "drop") {
      e.kind = Kind::kDrop;
    } else if (word == "hang") {
      e.kind = Kind::kHang;
    } else if (word == "crash") {
      e.kind = Kind::kCrash;
    } else if (word == "error") {
      e.kind = Kind::kError;
      if (eat('(')) {
        const size_t close = s_.find(')', i_);
        if (close == std::string_view::npos)
          refuse("')' closing error(text); the text cannot hold ')' or ';'");
        e.error = std::string(trim(s_.substr(i_, close - i_)));
        i_ = close + 1;
        e.spelled = "error(" + e.error + ")";
      }
    } else if (word == "sleep" || word == "delay") {
      e.kind = Kind::kSleep;
      e.ms = bounded_argument(e, word, "ms", kMaxSleepMs);
    } else if (word == "spin") {
      e.kind = Kind::kSpin;
      e.us = bounded_argument(e, word, "us", kMaxSpinUs);
    } else {
      refuse("an action: off, drop, error, error(text), hang, sleep(ms), delay(ms), spin(us) or crash");
    }
    return e;
  }

  Trigger trigger() {
    const std::string form = "a trigger after '@': N, N+, N-M or P%";
    const std::string_view number = take([](char c) { return is_digit(c) || c == '.'; });
    if (number.empty()) refuse(form);
    Trigger t;
    if (eat('%')) {
      double percent = 0;
      const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), percent);
      if (ec != std::errc{} || end != number.data() + number.size() || !(percent > 0 && percent <= 100))
        refuse("P% with 0 < P <= 100, got '" + std::string(number) + "%'");
      t.type = Trigger::kPercent;
      t.probability = percent / 100;
      return t;
    }
    if (number.find('.') != std::string_view::npos)
      refuse(form + "; a decimal is a percentage and needs '%'");
    t.first = whole(number, form);
    if (t.first == 0) refuse("hit numbers >= 1 (the first hit is 1)");
    if (eat('+')) {
      t.type = Trigger::kFrom;
    } else if (eat('-')) {
      t.type = Trigger::kRange;
      t.last = whole(form);
      if (t.last < t.first) refuse("N <= M in N-M");
    } else {
      t.type = Trigger::kNth;
    }
    return t;
  }

  std::string_view s_;
  size_t i_ = 0;
};

// The entries of a spec, in the order written. Pure.
std::vector<std::pair<std::string, Entry>> parse(std::string_view spec) {
  std::vector<std::pair<std::string, Entry>> entries;
  while (!spec.empty()) {
    const size_t end = std::min(spec.find(';'), spec.size());
    const std::string_view entry = trim(spec.substr(0, end));
    if (!entry.empty()) entries.push_back(EntryParser(entry).parse());
    spec.remove_prefix(std::min(end + 1, spec.size()));
  }
  return entries;
}

// A P% draw for hit n: uniform in [0, 1), a pure function of (stream, n), so
// the n-th hit fires or not the same way in every run with the same seed.
double draw(uint64_t stream, uint64_t n) {
  return static_cast<double>(core::splitmix64(stream ^ n) >> 11) * 0x1.0p-53;
}

bool fires(const Entry& e, uint64_t n) {
  const Trigger& t = e.trigger;
  switch (t.type) {
    case Trigger::kEvery:
      return true;
    case Trigger::kNth:
      return n == t.first;
    case Trigger::kFrom:
      return n >= t.first;
    case Trigger::kRange:
      return n >= t.first && n <= t.last;
    case Trigger::kPercent:
      return draw(e.stream, n) < t.probability;
  }
  return false;
}

struct Point {
  std::vector<Entry> entries;  // tried in this order at each hit
  mutable std::atomic<uint64_t> hits{0};
};
using Config = std::map<std::string, Point, std::less<>>;  // immutable once published, but for the counts

struct State {
  std::mutex config_mutex;  // guards `config` (the pointer); held only to copy or swap it
  std::shared_ptr<const Config> config;
  std::mutex hang_mutex;  // guards the two fields below; never held while another lock is
  std::condition_variable hang_cv;
  bool released = false;  // release_hangs() ran since the last configure()
  uint64_t releases = 0;  // release_hangs() calls; a hung thread waits for it to change
};

// Never destroyed: other threads may still hit or hang while the process exits.
State& state() {
  static State* s = new State;
  return *s;
}

void hang() {
  State& s = state();
  std::unique_lock lock(s.hang_mutex);
  if (s.released) return;
  const uint64_t seen = s.releases;
  s.hang_cv.wait(lock, [&] { return s.releases != seen; });
}

// Keeps the calling thread's CPU busy for `us` microseconds (its own CPU
// time, so that a process's CPU accounts for it, unlike a sleep).
void spin(uint64_t us) {
  const auto cpu_ns = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1'000'000'000LL + t.tv_nsec;
  };
  const int64_t until = cpu_ns() + static_cast<int64_t>(us) * 1000;
  while (cpu_ns() < until) {
  }
}

Outcome act(std::string_view name, const Entry& e, uint64_t n) {
  if (e.kind == Kind::kOff) return {};
  // One write of the whole line, so lines from different threads do not mix.
  // A spin is a cost added to many hits, not a fault: printed at hits 1, 2,
  // 4, 8, ... only.
  const std::string line = "troupe: failpoint " + std::string(name) + " fired: " + e.spelled + " (hit " +
                           std::to_string(n) + ")\n";
  if (e.kind != Kind::kSpin || (n & (n - 1)) == 0) std::fputs(line.c_str(), stderr);
  switch (e.kind) {
    case Kind::kOff:
      break;
    case Kind::kDrop:
      return {Action::kDrop, {}};
    case Kind::kError:
      return {Action::kError, e.error.empty() ? "error injected by failpoint " + std::string(name) : e.error};
    case Kind::kSleep:
      std::this_thread::sleep_for(std::chrono::milliseconds(e.ms));
      break;
    case Kind::kHang:
      hang();
      break;
    case Kind::kSpin:
      spin(e.us);
      break;
    case Kind::kCrash:
      std::_Exit(134);  // as abort() would end it: no destructors, no flush
  }
  return {};
}

std::shared_ptr<const Config> current() {
  State& s = state();
  std::lock_guard lock(s.config_mutex);
  return s.config;
}

}  // namespace

Outcome hit(std::string_view name) {
  const std::shared_ptr<const Config> config = current();
  if (!config) return {};
  const auto it = config->find(name);
  if (it == config->end()) return {};
  const Point& point = it->second;
  const uint64_t n = point.hits.fetch_add(1, std::memory_order_relaxed) + 1;
  for (const Entry& e : point.entries)
    if (fires(e, n)) return act(it->first, e, n);
  return {};
}

void configure(const std::string& spec, uint64_t seed) {
  auto config = std::make_shared<Config>();
  for (auto& [name, entry] : parse(spec)) {
    Point& point = (*config)[name];
    entry.stream =
        core::splitmix64(XXH3_64bits_withSeed(name.data(), name.size(), seed) + point.entries.size());
    point.entries.push_back(std::move(entry));
  }
  const bool any = !config->empty();
  State& s = state();
  {
    std::lock_guard lock(s.hang_mutex);
    s.released = false;
  }
  std::lock_guard lock(s.config_mutex);
  s.config = any ? std::move(config) : nullptr;
  detail::g_enabled.store(any, std::memory_order_relaxed);
}

void configure_from_env() {
  const char* spec = std::getenv("TROUPE_FAILPOINTS");
  const char* seed_text = std::getenv("TROUPE_FAILPOINTS_SEED");
  uint64_t seed = 0;
  if (seed_text != nullptr && *seed_text != '\0') {
    const std::optional<uint64_t> v = core::parse_whole_number(seed_text);
    if (!v)
      throw std::invalid_argument("TROUPE_FAILPOINTS_SEED: expected a whole number 0..2^64-1, got '" +
                                  std::string(seed_text) + "'");
    seed = *v;
  }
  configure(spec != nullptr ? spec : "", seed);
  if (enabled())
    std::fprintf(stderr, "troupe: failpoints active: %s (seed %llu)\n", spec,
                 static_cast<unsigned long long>(seed));
}

void release_hangs() {
  State& s = state();
  {
    std::lock_guard lock(s.hang_mutex);
    s.released = true;
    ++s.releases;
  }
  s.hang_cv.notify_all();
}

uint64_t hits(std::string_view name) {
  const std::shared_ptr<const Config> config = current();
  if (!config) return 0;
  const auto it = config->find(name);
  return it == config->end() ? 0 : it->second.hits.load(std::memory_order_relaxed);
}

}  // namespace troupe::fail
