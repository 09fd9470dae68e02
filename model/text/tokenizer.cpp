#include "model/text/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "model/text/pretokenizer.hpp"
#include "model/text/utf8.hpp"

namespace troupe::model {

namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

// GPT-2's bytes_to_unicode (encoder.py): printable bytes '!'..'~', '¡'..'¬',
// '®'..'ÿ' stand for themselves; the other 68 bytes, in increasing order, for
// U+0100, U+0101, ... Returns code point -> byte, -1 where none.
std::vector<int> unicode_to_byte_table() {
  auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  std::vector<int> table(256 + 68, -1);
  int n = 0;
  for (int b = 0; b < 256; ++b) table[printable(b) ? b : 256 + n++] = b;
  return table;
}

// Maps a vocab.json / merges.txt token (UTF-8 text in GPT-2's byte alphabet)
// back to raw bytes. Throws std::runtime_error naming `origin`.
std::string alphabet_to_bytes(const std::string& text, const std::string& origin) {
  static const std::vector<int> table = unicode_to_byte_table();
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const utf8::Sequence seq = utf8::next_sequence(text, pos);
    if (seq.kind != utf8::Sequence::kComplete)
      throw std::runtime_error(origin + ": token \"" + text + "\" is not valid UTF-8");
    const auto* p = reinterpret_cast<const unsigned char*>(text.data() + pos);
    uint32_t cp = seq.length == 1 ? p[0] : seq.length == 2 ? (p[0] & 0x1Fu) : (p[0] & 0x0Fu);
    for (size_t i = 1; i < seq.length; ++i) cp = (cp << 6) | (p[i] & 0x3Fu);
    if (cp >= table.size() || table[cp] < 0)
      throw std::runtime_error(origin + ": token \"" + text +
                               "\" has a character outside GPT-2's byte alphabet; is this a "
                               "byte-level BPE (GPT-2) vocabulary?");
    out.push_back(static_cast<char>(table[cp]));
    pos += seq.length;
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error(path +
                             ": cannot open; point at a folder holding GPT-2's vocab.json "
                             "and merges.txt (troupe download fetches them)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Merge {
  int32_t rank;    // line order in merges.txt, 0 = best
  int32_t merged;  // id of left + right
};

// Pieces longer than this are not cached (rare, and would bloat the cache).
constexpr size_t kMaxCachedPieceBytes = 128;
constexpr size_t kCacheShards = 16;
constexpr size_t kMaxEntriesPerShard = 8192;  // a full shard is cleared

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> id_bytes;                  // id -> raw bytes
  std::unordered_map<std::string, int32_t> bytes_id;  // raw bytes -> id
  std::array<int32_t, 256> byte_id{};                 // single byte -> id
  std::unordered_map<uint64_t, Merge> merges;         // pair_key(left, right) -> merge
  int32_t eos = -1;

  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  mutable std::array<CacheShard, kCacheShards> cache;

  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_cached(std::string_view piece, std::vector<int32_t>& out) const;
};

// Byte-pair merging of one piece, exactly as encoder.py's bpe(): repeatedly
// take the lowest-ranked adjacent pair and merge all its occurrences left to
// right. A min-heap of candidate pairs over a linked list of symbols makes
// this O(n log n) instead of encoder.py's O(n^2) per piece.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(piece.size());
  if (n == 0) return;
  struct Sym {
    int32_t id;
    int prev, next;  // neighbours in the list, -1 at the ends
  };
  std::vector<Sym> sym(n);
  for (int i = 0; i < n; ++i) sym[i] = {byte_id[static_cast<unsigned char>(piece[i])], i - 1, i + 1};
  sym[n - 1].next = -1;

  struct Cand {
    int32_t rank;
    int pos;  // index of the left symbol; symbols keep their start index, so order = text order
    int32_t left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto offer = [&](int pos, std::vector<Cand>& into) {
    const int nx = sym[pos].next;
    if (nx < 0) return;
    auto it = merges.find(pair_key(sym[pos].id, sym[nx].id));
    if (it != merges.end()) into.push_back({it->second.rank, pos, sym[pos].id, sym[nx].id});
  };
  std::vector<Cand> fresh;
  for (int i = 0; i + 1 < n; ++i) offer(i, fresh);
  for (const Cand& c : fresh) heap.push(c);

  std::vector<Cand> round;
  while (!heap.empty()) {
    // One round of encoder.py: every occurrence of the best pair, left to
    // right; pairs this creates join the heap only after the round.
    const int32_t rank = heap.top().rank;
    round.clear();
    while (!heap.empty() && heap.top().rank == rank) {
      round.push_back(heap.top());
      heap.pop();
    }
    fresh.clear();
    for (const Cand& c : round) {
      const int nx = sym[c.pos].next;
      // Stale when either symbol changed since the candidate was made.
      if (sym[c.pos].id != c.left || nx < 0 || sym[nx].id != c.right) continue;
      sym[c.pos].id = merges.at(pair_key(c.left, c.right)).merged;
      sym[c.pos].next = sym[nx].next;
      if (sym[nx].next >= 0) sym[sym[nx].next].prev = c.pos;
      sym[nx].id = -1;
      if (sym[c.pos].prev >= 0) offer(sym[c.pos].prev, fresh);
      offer(c.pos, fresh);
    }
    for (const Cand& c : fresh) heap.push(c);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void Tokenizer::Impl::bpe_cached(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kMaxCachedPieceBytes) {
    bpe(piece, out);
    return;
  }
  std::string key(piece);
  CacheShard& shard = cache[std::hash<std::string>{}(key) % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.words.find(key);
    if (it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  bpe(piece, out);
  std::vector<int32_t> ids(out.begin() + start, out.end());
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.words.size() >= kMaxEntriesPerShard) shard.words.clear();
  shard.words.emplace(std::move(key), std::move(ids));
}

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

const Tokenizer::Impl& Tokenizer::impl() const {
  if (!impl_) throw std::logic_error("Tokenizer is empty; load one with Tokenizer::from_dir or from_files");
  return *impl_;
}

Tokenizer Tokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt) {
  auto impl = std::make_shared<Impl>();

  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_json));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(vocab_json + ": not valid JSON: " + e.what());
  }
  if (!vocab.is_object() || vocab.empty())
    throw std::runtime_error(vocab_json + ": expected a JSON object of token -> id");
  const size_t n = vocab.size();
  impl->id_bytes.assign(n, std::string());
  std::vector<bool> seen(n, false);
  for (const auto& [text, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(n))
      throw std::runtime_error(vocab_json + ": token \"" + text + "\" has id " + value.dump() +
                               "; ids must be the integers 0.." + std::to_string(n - 1));
    const auto id = value.get<int32_t>();
    if (seen[id]) throw std::runtime_error(vocab_json + ": id " + std::to_string(id) + " is used twice");
    seen[id] = true;
    std::string bytes = text == kEndOfText ? text : alphabet_to_bytes(text, vocab_json);
    if (!impl->bytes_id.emplace(bytes, id).second)
      throw std::runtime_error(vocab_json + ": token \"" + text + "\" is listed twice");
    impl->id_bytes[id] = std::move(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = impl->bytes_id.find(std::string(1, static_cast<char>(b)));
    if (it == impl->bytes_id.end())
      throw std::runtime_error(vocab_json + ": no token for byte " + std::to_string(b) +
                               "; a byte-level BPE vocabulary has all 256");
    impl->byte_id[b] = it->second;
  }
  auto eos = impl->bytes_id.find(std::string(kEndOfText));
  if (eos == impl->bytes_id.end())
    throw std::runtime_error(vocab_json + ": no \"<|endoftext|>\" token; not a GPT-2 vocabulary");
  impl->eos = eos->second;

  std::istringstream lines(read_file(merges_txt));
  std::string line;
  int32_t rank = 0;
  for (size_t line_no = 1; std::getline(lines, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const std::string where = merges_txt + ":" + std::to_string(line_no);
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw std::runtime_error(where + ": expected \"left right\", got \"" + line + "\"");
    const std::string left = alphabet_to_bytes(line.substr(0, space), where);
    const std::string right = alphabet_to_bytes(line.substr(space + 1), where);
    auto l = impl->bytes_id.find(left), r = impl->bytes_id.find(right), m = impl->bytes_id.find(left + right);
    if (l == impl->bytes_id.end() || r == impl->bytes_id.end() || m == impl->bytes_id.end())
      throw std::runtime_error(where + ": merge \"" + line + "\" uses or makes a token missing from " +
                               vocab_json + "; are the two files from the same model?");
    // A repeated pair keeps its last rank, as encoder.py's dict does.
    impl->merges[pair_key(l->second, r->second)] = Merge{rank++, m->second};
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  return from_files(dir + "/vocab.json", dir + "/merges.txt");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const Impl& im = impl();
  if (const size_t bad = utf8::find_invalid(text); bad != std::string_view::npos)
    throw std::invalid_argument("Tokenizer::encode: text is not valid UTF-8 at byte offset " +
                                std::to_string(bad) + " (of " + std::to_string(text.size()) +
                                "); pass UTF-8 text");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  while (!text.empty()) {
    const size_t special = text.find(kEndOfText);
    for (std::string_view piece : gpt2_pretokenize(text.substr(0, special))) im.bpe_cached(piece, ids);
    if (special == std::string_view::npos) break;
    ids.push_back(im.eos);
    text.remove_prefix(special + kEndOfText.size());
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id);
  std::string text;
  text.reserve(bytes.size());
  utf8::decode_replace(bytes, /*final=*/true, text);
  return text;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& im = impl();
  if (id < 0 || id >= static_cast<int32_t>(im.id_bytes.size()))
    throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(im.id_bytes.size()) + ")");
  return im.id_bytes[id];
}

int32_t Tokenizer::vocab_size() const { return impl_ ? static_cast<int32_t>(impl_->id_bytes.size()) : 0; }

int32_t Tokenizer::eos_id() const { return impl().eos; }

bool Tokenizer::valid_id(int32_t id) const { return id >= 0 && id < vocab_size(); }

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok) : tok_(tok) {}

std::string IncrementalDecoder::push(int32_t id) {
  pending_ += tok_.token_bytes(id);
  std::string out;
  pending_.erase(0, utf8::decode_replace(pending_, /*final=*/false, out));
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  utf8::decode_replace(pending_, /*final=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace troupe::model
