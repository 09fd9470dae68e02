// The decoder fuzzer's property (decode_check.hpp) over a few hundred
// thousand mutated frames, with a seeded mutator, in every build (the
// libFuzzer target needs clang; this runs with any compiler).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "decode_check.hpp"
#include "sample_messages.hpp"

namespace troupe::transport {
namespace {

// Bytes that mean something to msgpack: headers of every kind and width.
constexpr uint8_t kInteresting[] = {0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2,
                                    0xc3, 0xc4, 0xc6, 0xc7, 0xc9, 0xca, 0xcb, 0xcc, 0xcf, 0xd0, 0xd3,
                                    0xd4, 0xd8, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff};

class Mutator {
 public:
  Mutator(std::vector<std::string> seeds, uint64_t seed) : seeds_(std::move(seeds)), rng_(seed) {}

  std::string next() {
    std::string s = pick();
    const int rounds = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < rounds; ++i) mutate(s);
    return s;
  }

 private:
  const std::string& pick() { return seeds_[rng_() % seeds_.size()]; }
  size_t pos(const std::string& s) { return s.empty() ? 0 : rng_() % s.size(); }

  void mutate(std::string& s) {
    switch (rng_() % 9) {
      case 0:  // flip a bit
        if (!s.empty()) s[pos(s)] ^= static_cast<char>(1u << (rng_() % 8));
        break;
      case 1:  // a msgpack header byte
        if (!s.empty()) s[pos(s)] = static_cast<char>(kInteresting[rng_() % sizeof kInteresting]);
        break;
      case 2:  // truncate
        s.resize(pos(s));
        break;
      case 3: {  // insert random bytes
        std::string ins(1 + rng_() % 8, '\0');
        for (char& c : ins) c = static_cast<char>(rng_());
        s.insert(pos(s), ins);
        break;
      }
      case 4: {  // delete a range
        const size_t p = pos(s);
        s.erase(p, rng_() % 16);
        break;
      }
      case 5: {  // splice: this frame's head, another's tail
        const std::string& other = pick();
        s = s.substr(0, pos(s)) + other.substr(pos(other));
        break;
      }
      case 6: {  // duplicate a range
        const size_t p = pos(s);
        s.insert(p, s.substr(p, rng_() % 32));
        break;
      }
      case 7:  // double: long frames, over the limit after a few rounds
        s += s;
        break;
      default: {  // a 0xff-filled length field: claims of 2^16 or 2^32
        if (s.empty()) break;
        const size_t p = pos(s);
        for (size_t i = p + 1; i < std::min(s.size(), p + 5); ++i) s[i] = '\xff';
        break;
      }
    }
  }

  std::vector<std::string> seeds_;
  std::mt19937_64 rng_;
};

TEST(DecodeSmoke, MutatedFramesNeverBreakTheDecoder) {
  std::vector<std::string> seeds;
  for (const Message& m : test::sample_messages()) seeds.push_back(encode(m));
  Mutator mutator(seeds, /*seed=*/20261130);
  std::map<std::string, int> outcomes;
  const int kInputs = 300000;
  for (int i = 0; i < kInputs; ++i) {
    const std::string input = mutator.next();
    std::optional<ErrorCode> code;
    auto problem = test::check_decode(input, /*max_frame_bytes=*/1024, &code);
    ASSERT_FALSE(problem.has_value()) << *problem << " (input " << i << ", " << input.size() << " bytes)";
    ++outcomes[code ? to_string(*code) : "ok"];
  }
  // The mutator reaches every outcome, so the property was checked on each.
  for (const char* o : {"ok", "malformed", "bad_field", "unknown_type", "bad_version", "too_large"})
    EXPECT_GT(outcomes[o], 0) << o;
  for (const auto& [o, n] : outcomes) std::cout << o << ": " << n << "\n";
}

}  // namespace
}  // namespace troupe::transport
