// Tokenizer against an implementation nobody here wrote: OpenAI's tiktoken
// (its Rust core, compiled to WASM in the npm package that scripts/setup.sh
// puts in TROUPE_TOOLS_DIR), id for id, on every code point and on random
// UTF-8. Without node or the package the tests skip, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "model/text/tokenizer.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

using Ids = std::vector<int32_t>;
using test::run_command;
using test::shell_quote;

// Letters and numbers new in Unicode 17.0. troupe's pattern follows Python's
// `regex` (Unicode 17: model/text/pretokenizer.cpp); tiktoken 1.0.22 has Unicode 16's
// tables, so next to an apostrophe, a letter or a digit these split differently.
// They are the only code points where the two disagree (each code point compared
// in six contexts, 2026-12-03: docs/architecture.md, "The tokenizer against
// tiktoken, and which Unicode").
constexpr std::pair<char32_t, char32_t> kNewInUnicode17[] = {
    {0x88f, 0x88f},     {0xc5c, 0xc5c},     {0xcdc, 0xcdc},     {0xa7ce, 0xa7cf},   {0xa7d2, 0xa7d2},
    {0xa7d4, 0xa7d4},   {0xa7f1, 0xa7f1},   {0x10940, 0x10959}, {0x10ec5, 0x10ec7}, {0x11db0, 0x11ddb},
    {0x11de0, 0x11de9}, {0x16ea0, 0x16eb8}, {0x16ebb, 0x16ed3}, {0x16ff2, 0x16ff6}, {0x187f8, 0x187ff},
    {0x18d09, 0x18d1e}, {0x18d80, 0x18df2}, {0x1e6c0, 0x1e6de}, {0x1e6e0, 0x1e6e2}, {0x1e6e4, 0x1e6e5},
    {0x1e6e7, 0x1e6ed}, {0x1e6f0, 0x1e6f4}, {0x1e6fe, 0x1e6ff}, {0x2b73a, 0x2b73f}, {0x2cea2, 0x2cead},
    {0x323b0, 0x33479},
};

bool new_in_unicode17(char32_t c) {
  for (const auto& [lo, hi] : kNewInUnicode17)
    if (c >= lo && c <= hi) return true;
  return false;
}

bool is_surrogate(char32_t c) { return c >= 0xd800 && c <= 0xdfff; }

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xc0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xe0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (c & 0x3f));
  }
  return s;
}

const Tokenizer& gpt2() {
  static const Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  return tok;
}

std::string node_modules() { return std::string(TROUPE_TOOLS_DIR) + "/node/node_modules"; }

// Why tiktoken cannot run here, or "" when it can.
std::string tiktoken_missing() {
  if (run_command("command -v node >/dev/null").status != 0) return "no node (scripts/setup.sh installs npm)";
  if (!std::filesystem::exists(node_modules() + "/tiktoken/package.json"))
    return "no tiktoken npm package in " + node_modules() + " (scripts/setup.sh installs it)";
  const auto probe = run_command("NODE_PATH=" + shell_quote(node_modules()) +
                                 " node -e \"require('tiktoken').get_encoding('gpt2').encode('hi')\"");
  if (probe.status != 0) return "tiktoken does not run under this node: " + probe.output.substr(0, 500);
  return "";
}

// tiktoken's ids for each text.
std::vector<Ids> tiktoken_encode(const std::vector<std::string>& texts) {
  test::TempDir dir;
  {
    std::ofstream in(dir.file("texts.jsonl"), std::ios::binary);
    for (const std::string& t : texts) in << nlohmann::json(t).dump() << '\n';
  }
  const std::string script = std::string(TROUPE_TEST_DIR) + "/text/tiktoken_encode.cjs";
  const auto r = run_command("NODE_PATH=" + shell_quote(node_modules()) + " node " + shell_quote(script) +
                                 " < " + shell_quote(dir.file("texts.jsonl")),
                             /*merge_stderr=*/false);
  if (r.status != 0) throw std::runtime_error("tiktoken_encode.cjs failed: " + r.output.substr(0, 2000));
  std::vector<Ids> out;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line).get<Ids>());
  if (out.size() != texts.size()) throw std::runtime_error("tiktoken_encode.cjs: wrong line count");
  return out;
}

// The first characters of `text` (at most 60 bytes), JSON-escaped.
std::string start_of(const std::string& text) {
  size_t n = std::min<size_t>(text.size(), 60);
  while (n < text.size() && (static_cast<unsigned char>(text[n]) & 0xc0) == 0x80) --n;  // whole characters
  return nlohmann::json(text.substr(0, n)).dump();
}

// ids[from, from + 12) (fewer at the end).
std::string window(const Ids& ids, size_t from) {
  const auto first = ids.begin() + static_cast<std::ptrdiff_t>(std::min(from, ids.size()));
  return testing::PrintToString(Ids(first, first + std::min<std::ptrdiff_t>(12, ids.end() - first)));
}

// Compares troupe's ids with tiktoken's for every text; prints the first few
// differences from a few ids before the first that differs.
void expect_same_ids(const std::vector<std::string>& texts, const std::vector<std::string>& labels) {
  const std::vector<Ids> reference = tiktoken_encode(texts);
  int differ = 0;
  size_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids ours = gpt2().encode(texts[i]);
    tokens += reference[i].size();
    if (ours == reference[i]) continue;
    if (++differ > 3) continue;
    size_t at = 0;
    while (at < ours.size() && at < reference[i].size() && ours[at] == reference[i][at]) ++at;
    const size_t from = at < 4 ? 0 : at - 4;
    ADD_FAILURE() << labels[i] << " (" << texts[i].size() << " bytes, starting " << start_of(texts[i])
                  << "): the ids differ from #" << at << "; from #" << from << ":\n  tiktoken "
                  << window(reference[i], from) << "\n  troupe   " << window(ours, from);
  }
  EXPECT_EQ(differ, 0) << "of " << texts.size() << " texts";
  EXPECT_GT(tokens, texts.size()) << "the reference encoded something";
}

// Every code point (but surrogates and Unicode 17's new letters), in blocks of
// 4096, each in contexts where its class decides the split: after it an
// apostrophe and a letter (a contraction, or punctuation that takes the
// apostrophe), before it a space and after it two (white space runs), between
// letters and between digits.
TEST(TokenizerVsTiktoken, EveryCodePointSplitsTheSame) {
  if (const std::string why = tiktoken_missing(); !why.empty()) GTEST_SKIP() << why;
  std::vector<std::string> texts, labels;
  for (char32_t first = 0; first <= 0x10ffff; first += 4096) {
    std::string text;
    for (char32_t c = first; c < first + 4096 && c <= 0x10ffff; ++c) {
      if (is_surrogate(c) || new_in_unicode17(c)) continue;
      const std::string s = utf8(c);
      text += s + "'d " + s + "  x" + s + "y1" + s + "2\n";
    }
    if (text.empty()) continue;
    std::ostringstream label;
    label << "code points U+" << std::hex << std::uppercase << first << "..U+" << first + 4095;
    texts.push_back(std::move(text));
    labels.push_back(label.str());
  }
  expect_same_ids(texts, labels);
}

// Random strings: white space of every kind (and the near misses U+180E,
// U+200B, U+FEFF), contractions in both cases, "<|endoftext|>" and its
// fragments, digits, and code points from many scripts and from anywhere.
TEST(TokenizerVsTiktoken, RandomUtf8EncodesTheSame) {
  if (const std::string why = tiktoken_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<char32_t> spaces = {0x9,    0xa,    0xb,    0xc,    0xd,    0x20,   0x85,
                                        0xa0,   0x1680, 0x2000, 0x2001, 0x2005, 0x200a, 0x2028,
                                        0x2029, 0x202f, 0x205f, 0x3000, 0xfeff, 0x180e, 0x200b,
                                        0x200c, 0x200d, 0x2060, 0x1c,   0x1d,   0x1e,   0x1f};
  const std::vector<std::string> fragments = {"'s",          "'t",          "'re", "'ve",  "'m",
                                              "'ll",         "'d",          "'S",  "'T",   "'RE",
                                              "'Ll",         "'",           "''",  "'x",   "\xE2\x80\x99s",
                                              " ",           "  ",          "\n",  "\r\n", "<|endoftext|>",
                                              "<|endoftext", "endoftext|>", "<|",  "|>"};
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7e},       {0x20, 0x7e},       {0x20, 0x7e},       {0xa0, 0x24f},      {0x300, 0x36f},
      {0x370, 0x3ff},     {0x400, 0x4ff},     {0x590, 0x6ff},     {0x900, 0x97f},     {0xe00, 0xe7f},
      {0x1100, 0x11ff},   {0x1e00, 0x1fff},   {0x2000, 0x206f},   {0x2070, 0x218f},   {0x2460, 0x24ff},
      {0x3000, 0x30ff},   {0x4e00, 0x4e80},   {0xac00, 0xac80},   {0xff00, 0xffef},   {0x1d400, 0x1d7ff},
      {0x1f300, 0x1faff}, {0x10000, 0x1007f}, {0x20000, 0x20080}, {0x2eb00, 0x2ef00}, {0x30000, 0x3134f},
      {0xe0000, 0xe007f}, {0xf0000, 0xf0010}, {0x0, 0x10ffff},    {0x0, 0x10ffff},    {0x0, 0x2ffff}};
  std::mt19937 rng(20261203);
  auto between = [&](size_t lo, size_t hi) { return std::uniform_int_distribution<size_t>(lo, hi)(rng); };
  auto code_point = [&] {
    for (;;) {
      const auto& [lo, hi] = ranges[between(0, ranges.size() - 1)];
      const auto c = static_cast<char32_t>(between(lo, hi));
      if (!is_surrogate(c) && !new_in_unicode17(c)) return c;
    }
  };
  std::vector<std::string> texts, labels;
  for (int i = 0; i < 20000; ++i) {
    const size_t length = i % 100 == 99 ? between(200, 2000) : between(0, 40);
    std::string text;
    for (size_t j = 0; j < length; ++j) {
      const double k = std::uniform_real_distribution<double>(0, 1)(rng);
      if (k < 0.15)
        text += utf8(spaces[between(0, spaces.size() - 1)]);
      else if (k < 0.25)
        text += fragments[between(0, fragments.size() - 1)];
      else if (k < 0.35)
        text += static_cast<char>('0' + between(0, 9));
      else
        text += utf8(code_point());
    }
    texts.push_back(std::move(text));
    labels.push_back("random text " + std::to_string(i));
  }
  expect_same_ids(texts, labels);
}

}  // namespace
}  // namespace troupe::model
