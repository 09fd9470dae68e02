#include "model/text/pretokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace troupe::model {

namespace {

// clang-format off
// Unicode White_Space, as \s in Python's `regex` and Rust's `regex`. PCRE2's
// \s under UCP also takes U+180E, which GPT-2's tokenizers do not.
#define TROUPE_WS "\\t\\n\\x0b\\f\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

// Code points that are letters (L) or numbers (N) in Unicode 15.0-17.0 (the
// tables of Python's `regex` 2026.5) but unassigned in PCRE2 10.42's Unicode
// 14 tables. Harmless under a newer PCRE2.
#define TROUPE_NEW_L                                                                               \
  "\\x{88f}\\x{c5c}\\x{cdc}\\x{1c89}-\\x{1c8a}\\x{a7cb}-\\x{a7cf}\\x{a7d2}\\x{a7d4}\\x{a7da}-"      \
  "\\x{a7dc}\\x{a7f1}\\x{105c0}-\\x{105f3}\\x{10940}-\\x{10959}\\x{10d4a}-\\x{10d65}\\x{10d6f}-"   \
  "\\x{10d85}\\x{10ec2}-\\x{10ec7}\\x{1123f}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138b}\\x{1138e}"  \
  "\\x{11390}-\\x{113b5}\\x{113b7}\\x{113d1}\\x{113d3}\\x{11bc0}-\\x{11be0}\\x{11db0}-\\x{11ddb}"  \
  "\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}\\x{1342f}\\x{13441}-\\x{13446}\\x{13460}-" \
  "\\x{143fa}\\x{16100}-\\x{1611d}\\x{16d40}-\\x{16d6c}\\x{16ea0}-\\x{16eb8}\\x{16ebb}-\\x{16ed3}"  \
  "\\x{16ff2}-\\x{16ff3}\\x{187f8}-\\x{187ff}\\x{18cff}\\x{18d09}-\\x{18d1e}\\x{18d80}-\\x{18df2}"  \
  "\\x{1b132}\\x{1b155}\\x{1df25}-\\x{1df2a}\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{1e5d0}-"  \
  "\\x{1e5ed}\\x{1e5f0}\\x{1e6c0}-\\x{1e6de}\\x{1e6e0}-\\x{1e6e2}\\x{1e6e4}-\\x{1e6e5}\\x{1e6e7}-"  \
  "\\x{1e6ed}\\x{1e6f0}-\\x{1e6f4}\\x{1e6fe}-\\x{1e6ff}\\x{2b739}-\\x{2b73f}\\x{2cea2}-\\x{2cead}"  \
  "\\x{2ebf0}-\\x{2ee5d}\\x{31350}-\\x{33479}"
#define TROUPE_NEW_N                                                                             \
  "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}\\x{11de0}-\\x{11de9}\\x{11f50}-" \
  "\\x{11f59}\\x{16130}-\\x{16139}\\x{16d70}-\\x{16d79}\\x{16ff4}-\\x{16ff6}\\x{1ccf0}-\\x{1ccf9}"  \
  "\\x{1d2c0}-\\x{1d2d3}\\x{1e4f0}-\\x{1e4f9}\\x{1e5f1}-\\x{1e5fa}"

// GPT-2's pattern with \s, \S, \p{L}, \p{N} spelled out as above.
constexpr const char* kPattern =
    "'s|'t|'re|'ve|'m|'ll|'d"
    "| ?[\\p{L}" TROUPE_NEW_L "]+"
    "| ?[\\p{N}" TROUPE_NEW_N "]+"
    "| ?[^" TROUPE_WS "\\p{L}\\p{N}" TROUPE_NEW_L TROUPE_NEW_N "]+"
    "|[" TROUPE_WS "]+(?![^" TROUPE_WS "])"
    "|[" TROUPE_WS "]+";

#undef TROUPE_WS
#undef TROUPE_NEW_L
#undef TROUPE_NEW_N
// clang-format on

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

// Compiled once per process; a compiled pattern is immutable and may be
// matched from many threads at once.
const pcre2_code* pattern() {
  static const std::unique_ptr<pcre2_code, CodeDeleter> code = [] {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
    if (!c) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::runtime_error("GPT-2 pre-tokenizer pattern does not compile at offset " +
                               std::to_string(err_offset) + ": " + reinterpret_cast<const char*>(msg));
    }
    // JIT is an optimisation; without it (unsupported CPU) pcre2_match interprets.
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    return std::unique_ptr<pcre2_code, CodeDeleter>(c);
  }();
  return code.get();
}

// Per-thread match state: match data, and a JIT stack large enough that long
// runs (100 KB of one class) never hit PCRE2_ERROR_JIT_STACKLIMIT.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  ThreadMatchState() {
    if (!data || !context || !jit_stack) throw std::runtime_error("PCRE2: out of memory");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  ThreadMatchState(const ThreadMatchState&) = delete;
  ThreadMatchState& operator=(const ThreadMatchState&) = delete;
};

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  const pcre2_code* code = pattern();
  thread_local ThreadMatchState state;
  std::vector<std::string_view> pieces;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE pos = 0;
  while (pos < text.size()) {
    // NO_UTF_CHECK: the caller validated the text; PCRE2 would otherwise
    // re-check the whole subject on every call (quadratic).
    const int rc =
        pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // unreachable: every character matches some branch
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error("GPT-2 pre-tokenizer failed at byte " + std::to_string(pos) + ": " +
                               reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    // Every branch consumes at least one character, so ov[1] > ov[0] >= pos.
    pieces.emplace_back(text.data() + ov[0], ov[1] - ov[0]);
    pos = ov[1];
  }
  return pieces;
}

}  // namespace troupe::model
