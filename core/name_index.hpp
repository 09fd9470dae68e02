#pragma once
// NameIndex: the prefix cache's map from a block's 64-bit name to its block id
// (BlockAllocator); also SequenceTable's map from a sequence id to its entry.
// Open addressing with linear probing in one flat array, so a lookup reads
// one cache line where std::unordered_map reads a bucket and a node (and
// divides by a prime): both are looked up for every block or work item, and
// those reads miss the cache. Grows at half full (memory follows the cached blocks);
// deletion shifts the following entries back (no tombstones). Any key works,
// weak test names included: slots are chosen by a multiplicative mix.
// Torch-free, no threads.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::core {

class NameIndex {
 public:
  // The id stored under `name`, or -1.
  int32_t find(uint64_t name) const {
    if (size_ == 0) return -1;
    for (size_t i = home(name);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.name == name) return s.id;
    }
  }
  // Stores id (>= 0) under a name not present yet; false (and no change) when it is.
  bool insert(uint64_t name, int32_t id) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    size_t i = home(name);
    for (; slots_[i].id >= 0; i = (i + 1) & mask_)
      if (slots_[i].name == name) return false;
    slots_[i] = {name, id};
    ++size_;
    return true;
  }
  // Removes `name`; false when it is not present.
  bool erase(uint64_t name) {
    if (size_ == 0) return false;
    size_t i = home(name);
    for (; slots_[i].name != name || slots_[i].id < 0; i = (i + 1) & mask_)
      if (slots_[i].id < 0) return false;
    // Backward shift: move each later entry of the run whose home does not lie
    // in (i, j] into the hole, so every entry stays reachable from its home.
    for (size_t j = (i + 1) & mask_; slots_[j].id >= 0; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].name);
      const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i] = Slot{};
    --size_;
    return true;
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Starts fetching the line where a lookup of `name` begins (a caller about
  // to look up many names fetches them all first, not one miss at a time).
  void prefetch(uint64_t name) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[home(name)]);
  }

 private:
  struct Slot {
    uint64_t name = 0;
    int32_t id = -1;  // -1: empty
  };
  size_t home(uint64_t name) const {  // Fibonacci hashing: the top bits of name * 2^64 / phi
    return static_cast<size_t>((name * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    const size_t n = old.empty() ? 16 : 2 * old.size();
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    shift_ = 64;
    for (size_t k = n; k > 1; k >>= 1) --shift_;
    size_ = 0;
    for (const Slot& s : old)
      if (s.id >= 0) insert(s.name, s.id);
  }

  std::vector<Slot> slots_;
  size_t size_ = 0, mask_ = 0;
  int shift_ = 64;
};

}  // namespace troupe::core
