#pragma once
// Failpoints: named places in the shipped binary where a chaos run injects a
// fault (FoundationDB's BUGGIFY, TiKV's fail-rs). Off unless TROUPE_FAILPOINTS
// is set; the grammar, the triggers and every failpoint are in
// docs/failpoints.md.
//
//   if (auto f = TROUPE_FAILPOINT("node.send_result"); f.action == fail::Action::kDrop) return;
//
// Thread-safe: any thread may hit any failpoint; configure() may run while
// others hit (a hit in flight finishes under the configuration it started with).
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::fail {

// What the caller must do. sleep, spin, hang and crash are done inside hit().
enum class Action { kNone, kDrop, kError };

struct Outcome {
  Action action = Action::kNone;
  std::string error;  // kError only: the text of error(text), or one naming the failpoint
};

namespace detail {
inline std::atomic<bool> g_enabled{false};  // true while a spec with at least one entry is configured
}  // namespace detail

// One relaxed load: a failpoint in a hot path costs one predictable branch
// while nothing is configured.
inline bool enabled() noexcept {
  return __builtin_expect(detail::g_enabled.load(std::memory_order_relaxed), 0);
}

// Counts one hit of `name` and acts on the first of its entries whose trigger
// fires: sleeps or hangs the calling thread, ends the process (crash), or
// returns drop / error. A name absent from the spec returns kNone uncounted.
// Each action taken prints one line to stderr (a spin, a cost added to many
// hits, only at hits 1, 2, 4, 8, ...):
//   troupe: failpoint <name> fired: <action> (hit N)
[[gnu::cold]] Outcome hit(std::string_view name);

// Replaces the configuration and restarts every hit count at 0; "" turns all
// off. `seed` picks the P% draws. Throws std::invalid_argument naming the bad
// entry and what was expected; the old configuration then stays.
void configure(const std::string& spec, uint64_t seed = 0);

// configure(TROUPE_FAILPOINTS, TROUPE_FAILPOINTS_SEED or 0), printing
// "troupe: failpoints active: <spec> (seed S)" to stderr when any entry is
// active. Throws std::invalid_argument on a bad spec or seed.
void configure_from_env();

// Wakes every thread hung by a `hang` action; later hangs return at once
// until the next configure(). For a clean shutdown under chaos.
void release_hangs();

// Hits of `name` since the last configure() (0 for a name not in the spec).
uint64_t hits(std::string_view name);

}  // namespace troupe::fail

// The name expression is evaluated, and hit() called, only while enabled().
#define TROUPE_FAILPOINT(name) \
  (::troupe::fail::enabled() ? ::troupe::fail::hit(name) : ::troupe::fail::Outcome{})
