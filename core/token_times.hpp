#pragma once
// TokenTimes: when each streamed piece of one request arrived, in nanoseconds,
// kept as the first time and the gaps after it in 4 bytes each instead of 8
// bytes a time. A simulated hour holds 100 million of them, written one per
// token into memory that is new to the process (docs/notes/2026-12-02-simulator-speed.md
// measures what that costs). Exact for any times: a gap that does not fit an int32
// (2.1 s and more, or a time before the one it follows) is marked, and the
// time itself follows the mark in two words.
//
// A sequence of int64_t times: push_back, front, back, size, iteration in
// order (no random access). Torch-free, no threads.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <vector>

namespace troupe::core {

class TokenTimes {
 public:
  TokenTimes() = default;
  explicit TokenTimes(const std::vector<int64_t>& times) {
    reserve(times.size());
    for (int64_t t : times) push_back(t);
  }

  void reserve(size_t n) { words_.reserve(n > 0 ? n - 1 : 0); }
  void push_back(int64_t t) {
    if (size_ == 0) {
      first_ = t;
    } else if (int64_t gap = 0; !__builtin_sub_overflow(t, last_, &gap) && gap > kMark &&
                                gap <= std::numeric_limits<int32_t>::max()) {
      words_.push_back(static_cast<int32_t>(gap));
    } else {
      const auto u = static_cast<uint64_t>(t);
      words_.push_back(kMark);
      words_.push_back(static_cast<int32_t>(static_cast<uint32_t>(u)));
      words_.push_back(static_cast<int32_t>(static_cast<uint32_t>(u >> 32)));
    }
    last_ = t;
    ++size_;
  }
  void clear() {
    words_.clear();
    size_ = 0;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t front() const { return first_; }  // when not empty
  int64_t back() const { return last_; }    // when not empty

  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = int64_t;
    using difference_type = std::ptrdiff_t;
    using pointer = const int64_t*;
    using reference = const int64_t&;

    const_iterator() = default;
    reference operator*() const { return time_; }
    const_iterator& operator++() {
      if (++index_ < owner_->size_) {
        const int32_t* w = owner_->words_.data() + word_;
        if (w[0] != kMark) {
          time_ += w[0];
          word_ += 1;
        } else {
          time_ = static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(w[1])) |
                                       static_cast<uint64_t>(static_cast<uint32_t>(w[2])) << 32);
          word_ += 3;
        }
      }
      return *this;
    }
    const_iterator operator++(int) {
      const_iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const const_iterator& o) const { return index_ == o.index_; }
    bool operator!=(const const_iterator& o) const { return index_ != o.index_; }

   private:
    friend class TokenTimes;
    const_iterator(const TokenTimes* owner, size_t index)
        : owner_(owner), index_(index), time_(owner->first_) {}
    const TokenTimes* owner_ = nullptr;
    size_t index_ = 0;  // of the current time; size() = the end
    size_t word_ = 0;   // where the next time's word(s) start
    int64_t time_ = 0;
  };
  using iterator = const_iterator;
  using value_type = int64_t;

  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size_}; }
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }
  // f(t[i] - t[i - 1]) for each i >= 1, in order (modulo 2^64 where the
  // difference overflows int64: defined, unlike the plain subtraction).
  template <typename F>
  void for_each_gap(F f) const {
    const_iterator it = begin(), stop = end();
    if (it == stop) return;
    int64_t prev = *it;
    for (++it; it != stop; ++it) {
      f(static_cast<int64_t>(static_cast<uint64_t>(*it) - static_cast<uint64_t>(prev)));
      prev = *it;
    }
  }

  friend bool operator==(const TokenTimes& a, const TokenTimes& b) {
    return a.size_ == b.size_ && (a.size_ == 0 || a.first_ == b.first_) && a.words_ == b.words_;
  }
  friend bool operator!=(const TokenTimes& a, const TokenTimes& b) { return !(a == b); }

 private:
  // Marks a time kept whole: the next two words are its low and high halves.
  static constexpr int32_t kMark = std::numeric_limits<int32_t>::min();
  int64_t first_ = 0, last_ = 0;
  std::vector<int32_t> words_;  // per time after the first: its gap, or kMark and the time
  size_t size_ = 0;
};

}  // namespace troupe::core
