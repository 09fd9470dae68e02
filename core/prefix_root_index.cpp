#include "core/prefix_root_index.hpp"

#include <xxhash.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe::core {

// Unkeyed: a crafted collision only makes placement ask one more worker,
// whose allocator compares the tokens (and is keyed itself).
uint64_t PrefixRootIndex::key(const int32_t* tokens, int32_t n) {
  return XXH3_64bits_withSeed(tokens, static_cast<size_t>(n) * sizeof(int32_t), static_cast<uint64_t>(n));
}

void PrefixRootIndex::add(uint64_t worker, const int32_t* tokens, int32_t n) {
  by_key_[key(tokens, n)].push_back(worker);
  ++entries_;
}

void PrefixRootIndex::remove(uint64_t worker, const int32_t* tokens, int32_t n) {
  if (auto it = by_key_.find(key(tokens, n)); it != by_key_.end()) {
    std::vector<uint64_t>& v = it->second;
    if (auto at = std::find(v.begin(), v.end(), worker); at != v.end()) {
      *at = v.back();
      v.pop_back();
      if (v.empty()) by_key_.erase(it);
      --entries_;
      return;
    }
  }
  throw std::logic_error("PrefixRootIndex: worker " + std::to_string(worker) +
                         " removes a first block it never added");
}

void PrefixRootIndex::remove_worker(uint64_t worker) {
  for (auto it = by_key_.begin(); it != by_key_.end();) {
    auto& v = it->second;
    const size_t before = v.size();
    v.erase(std::remove(v.begin(), v.end(), worker), v.end());
    entries_ -= before - v.size();
    it = v.empty() ? by_key_.erase(it) : std::next(it);
  }
}

const std::vector<uint64_t>* PrefixRootIndex::holders(const int32_t* tokens, int32_t n) const {
  auto it = by_key_.find(key(tokens, n));
  return it == by_key_.end() ? nullptr : &it->second;
}

}  // namespace troupe::core
