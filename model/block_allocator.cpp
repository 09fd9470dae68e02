#include "model/block_allocator.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe::model {
namespace {

// splitmix64's finalizer: a full-avalanche 64-bit mix.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

void fail(const std::string& what) { throw std::logic_error("BlockAllocator: " + what); }

}  // namespace

BlockAllocator::BlockAllocator(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching)
    : num_blocks_(num_blocks), block_size_(block_size), prefix_caching_(enable_prefix_caching) {
  if (num_blocks < 1) throw std::invalid_argument("BlockAllocator: num_blocks must be >= 1");
  if (block_size < 1) throw std::invalid_argument("BlockAllocator: block_size must be >= 1");
  blocks_.resize(static_cast<size_t>(num_blocks));
  clean_.reserve(static_cast<size_t>(num_blocks));
  for (int32_t b = num_blocks - 1; b >= 0; --b) clean_.push_back(b);
  if (prefix_caching_) tokens_.resize(static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size));
}

const BlockAllocator::Block& BlockAllocator::at(int32_t block) const {
  if (block < 0 || block >= num_blocks_) {
    throw std::out_of_range("BlockAllocator: block " + std::to_string(block) + " is not in [0, " +
                            std::to_string(num_blocks_) + ")");
  }
  return blocks_[static_cast<size_t>(block)];
}

void BlockAllocator::lru_push_back(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  blk.lru_prev = lru_tail_;
  blk.lru_next = -1;
  if (lru_tail_ >= 0) blocks_[static_cast<size_t>(lru_tail_)].lru_next = b;
  else lru_head_ = b;
  lru_tail_ = b;
  ++num_evictable_;
}

void BlockAllocator::lru_remove(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  if (blk.lru_prev >= 0) blocks_[static_cast<size_t>(blk.lru_prev)].lru_next = blk.lru_next;
  else lru_head_ = blk.lru_next;
  if (blk.lru_next >= 0) blocks_[static_cast<size_t>(blk.lru_next)].lru_prev = blk.lru_prev;
  else lru_tail_ = blk.lru_prev;
  blk.lru_prev = blk.lru_next = -1;
  --num_evictable_;
}

void BlockAllocator::uncache(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  by_hash_.erase(blk.hash);
  blk.cached = false;
  blk.hash = blk.parent_hash = 0;
}

int32_t BlockAllocator::allocate() {
  int32_t b;
  if (!clean_.empty()) {
    b = clean_.back();
    clean_.pop_back();
  } else if (lru_head_ >= 0) {
    b = lru_head_;
    lru_remove(b);
    uncache(b);
    ++evictions_;
  } else {
    return -1;
  }
  blocks_[static_cast<size_t>(b)].ref = 1;
  return b;
}

bool BlockAllocator::allocate(int32_t n, std::vector<int32_t>& out) {
  if (n < 0) throw std::invalid_argument("BlockAllocator: cannot allocate a negative number of blocks");
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) out.push_back(allocate());
  return true;
}

void BlockAllocator::release(int32_t block) {
  Block& blk = at(block);
  if (blk.ref <= 0) fail("release of free block " + std::to_string(block));
  if (--blk.ref > 0) return;
  if (blk.cached) lru_push_back(block);
  else clean_.push_back(block);
}

void BlockAllocator::release_all(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) release(*it);
}

void BlockAllocator::share(int32_t block) {
  Block& blk = at(block);
  if (!blk.cached) fail("share of uncached block " + std::to_string(block));
  if (blk.ref == 0) lru_remove(block);
  ++blk.ref;
}

uint64_t BlockAllocator::hash_block(uint64_t parent_hash, const int32_t* tokens, int32_t n) {
  uint64_t h = mix64(parent_hash + 0x9e3779b97f4a7c15ULL);
  for (int32_t i = 0; i < n; ++i) {
    h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 0x9e3779b97f4a7c15ULL));
  }
  return h;
}

bool BlockAllocator::register_block(int32_t block, uint64_t hash, uint64_t parent_hash,
                                    const int32_t* tokens) {
  Block& blk = at(block);
  if (blk.ref <= 0) fail("register of free block " + std::to_string(block));
  if (!prefix_caching_ || blk.cached || by_hash_.count(hash) != 0) return false;
  blk.cached = true;
  blk.hash = hash;
  blk.parent_hash = parent_hash;
  std::copy(tokens, tokens + block_size_, tokens_.begin() + static_cast<ptrdiff_t>(block) * block_size_);
  by_hash_.emplace(hash, block);
  return true;
}

std::vector<int32_t> BlockAllocator::find_prefix(const std::vector<uint64_t>& hashes,
                                                 const int32_t* tokens, int32_t max_blocks) const {
  std::vector<int32_t> found;
  if (!prefix_caching_) return found;
  const int32_t n = std::min<int32_t>(max_blocks, static_cast<int32_t>(hashes.size()));
  uint64_t parent = 0;
  for (int32_t i = 0; i < n; ++i) {
    auto it = by_hash_.find(hashes[static_cast<size_t>(i)]);
    if (it == by_hash_.end()) break;
    const Block& blk = blocks_[static_cast<size_t>(it->second)];
    const int32_t* want = tokens + static_cast<ptrdiff_t>(i) * block_size_;
    const int32_t* have = tokens_.data() + static_cast<ptrdiff_t>(it->second) * block_size_;
    if (blk.parent_hash != parent || !std::equal(want, want + block_size_, have)) break;
    found.push_back(it->second);
    parent = blk.hash;
  }
  return found;
}

void BlockAllocator::record_lookup(int32_t queried, int32_t hit) {
  hit_blocks_ += hit;
  miss_blocks_ += queried - hit;
}

void BlockAllocator::clear_cache() {
  while (lru_head_ >= 0) {
    int32_t b = lru_head_;
    lru_remove(b);
    uncache(b);
    clean_.push_back(b);
  }
  for (int32_t b = 0; b < num_blocks_; ++b) {
    if (blocks_[static_cast<size_t>(b)].cached) uncache(b);
  }
}

void BlockAllocator::check_invariants() const {
  std::vector<char> seen(static_cast<size_t>(num_blocks_), 0);
  for (int32_t b : clean_) {
    if (b < 0 || b >= num_blocks_) fail("clean list holds bad id " + std::to_string(b));
    if (seen[static_cast<size_t>(b)]++) fail("block " + std::to_string(b) + " twice in the clean list");
    const Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.ref != 0 || blk.cached) fail("clean block " + std::to_string(b) + " has a ref or a hash");
  }
  int32_t lru_count = 0, prev = -1;
  for (int32_t b = lru_head_; b >= 0; b = blocks_[static_cast<size_t>(b)].lru_next) {
    if (seen[static_cast<size_t>(b)]++) fail("block " + std::to_string(b) + " free twice (LRU)");
    const Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.ref != 0 || !blk.cached) fail("LRU block " + std::to_string(b) + " is used or uncached");
    if (blk.lru_prev != prev) fail("LRU back link broken at " + std::to_string(b));
    prev = b;
    if (++lru_count > num_blocks_) fail("LRU has a cycle");
  }
  if (prev != lru_tail_) fail("LRU tail is wrong");
  if (lru_count != num_evictable_) fail("evictable count is wrong");
  size_t cached = 0;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.ref < 0) fail("negative ref on block " + std::to_string(b));
    if (blk.ref == 0 && !seen[static_cast<size_t>(b)]) fail("block " + std::to_string(b) + " leaked (ref 0, not free)");
    if (blk.ref > 0 && seen[static_cast<size_t>(b)]) fail("used block " + std::to_string(b) + " is on a free list");
    if (blk.cached) {
      ++cached;
      auto it = by_hash_.find(blk.hash);
      if (it == by_hash_.end() || it->second != b) fail("hash map misses cached block " + std::to_string(b));
    }
  }
  if (cached != by_hash_.size()) fail("hash map holds stale entries");
  if (num_free() + num_used() != num_blocks_) fail("free + used != total");
}

}  // namespace troupe::model
