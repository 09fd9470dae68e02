#include "core/block_allocator.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

namespace troupe::core {
namespace {

void fail(const std::string& what) { throw std::logic_error("BlockAllocator: " + what); }

// XXH3-64 of (parent name, tokens) seeded with the key.
uint64_t xxh3_block(uint64_t key, uint64_t parent_hash, const int32_t* tokens, int32_t n) {
  constexpr int32_t kStack = 64;
  const size_t bytes = sizeof parent_hash + static_cast<size_t>(n) * sizeof(int32_t);
  unsigned char stack[sizeof(uint64_t) + kStack * sizeof(int32_t)];
  std::vector<unsigned char> heap;
  unsigned char* buf = stack;
  if (n > kStack) {
    heap.resize(bytes);
    buf = heap.data();
  }
  std::memcpy(buf, &parent_hash, sizeof parent_hash);
  std::memcpy(buf + sizeof parent_hash, tokens, static_cast<size_t>(n) * sizeof(int32_t));
  return XXH3_64bits_withSeed(buf, bytes, key);
}

uint64_t random_key() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 0x5bd1e9955bd1e995ULL;
}

}  // namespace

BlockAllocator::BlockAllocator(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching,
                               uint64_t hash_key)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      hash_key_(hash_key != 0 ? hash_key : random_key()) {
  if (num_blocks < 1) throw std::invalid_argument("BlockAllocator: num_blocks must be >= 1");
  if (block_size < 1) throw std::invalid_argument("BlockAllocator: block_size must be >= 1");
}

void BlockAllocator::out_of_pool(int32_t block) const {
  throw std::out_of_range("BlockAllocator: block " + std::to_string(block) + " is not in [0, " +
                          std::to_string(num_blocks_) + ")");
}

void BlockAllocator::lru_push_back(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  blk.lru_prev = lru_tail_;
  blk.lru_next = -1;
  if (lru_tail_ >= 0)
    blocks_[static_cast<size_t>(lru_tail_)].lru_next = b;
  else
    lru_head_ = b;
  lru_tail_ = b;
  ++num_evictable_;
}

void BlockAllocator::lru_remove(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  if (blk.lru_prev >= 0)
    blocks_[static_cast<size_t>(blk.lru_prev)].lru_next = blk.lru_next;
  else
    lru_head_ = blk.lru_next;
  if (blk.lru_next >= 0)
    blocks_[static_cast<size_t>(blk.lru_next)].lru_prev = blk.lru_prev;
  else
    lru_tail_ = blk.lru_prev;
  blk.lru_prev = blk.lru_next = -1;
  --num_evictable_;
}

void BlockAllocator::uncache(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  by_hash_.erase(blk.hash);
  if (blk.parent < 0 && roots_.erase(blk.hash) && root_observer_)
    root_observer_(block_tokens(b), false);
  blk.cached = false;
  blk.hash = 0;
  blk.parent = -1;
  ++blk.gen;  // children registered after this block no longer chain to it
}

int32_t BlockAllocator::allocate() {
  int32_t b;
  if (!clean_.empty()) {
    b = clean_.back();
    clean_.pop_back();
  } else if (static_cast<int32_t>(blocks_.size()) < num_blocks_) {
    b = static_cast<int32_t>(blocks_.size());
    blocks_.emplace_back();
  } else if (lru_head_ >= 0) {
    b = lru_head_;
    lru_remove(b);
    uncache(b);
    ++evictions_;
    // The next victim's lines (its block, the name it frees, the block after
    // it), fetched now: this pool's next eviction comes a step or more later,
    // after other work, and would otherwise wait on each in turn.
    if (lru_head_ >= 0) {
      const Block& next = blocks_[static_cast<size_t>(lru_head_)];  // in cache: lru_remove wrote it
      by_hash_.prefetch(next.hash);
      if (next.parent < 0) roots_.prefetch(next.hash);
      if (next.lru_next >= 0) __builtin_prefetch(&blocks_[static_cast<size_t>(next.lru_next)]);
    }
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
  if (at(block).ref <= 0) fail("release of free block " + std::to_string(block));
  Block& blk = blocks_[static_cast<size_t>(block)];  // used, so handed out
  if (--blk.ref > 0) return;
  if (blk.cached)
    lru_push_back(block);
  else
    clean_.push_back(block);
}

void BlockAllocator::release_all(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) release(*it);
}

void BlockAllocator::share(int32_t block) {
  if (!at(block).cached) fail("share of uncached block " + std::to_string(block));
  Block& blk = blocks_[static_cast<size_t>(block)];  // cached, so handed out
  if (blk.ref == 0) lru_remove(block);
  ++blk.ref;
}

uint64_t BlockAllocator::hash_block(uint64_t parent_hash, const int32_t* tokens) const {
  if (hash_fn_) return hash_fn_(hash_key_, parent_hash, tokens, block_size_);
  return xxh3_block(hash_key_, parent_hash, tokens, block_size_);
}

bool BlockAllocator::register_block(int32_t block, int32_t parent_block, uint64_t hash,
                                    const int32_t* tokens) {
  if (at(block).ref <= 0) fail("register of free block " + std::to_string(block));
  Block& blk = blocks_[static_cast<size_t>(block)];  // used, so handed out
  if (!prefix_caching_ || blk.cached) return false;
  uint32_t parent_gen = 0;
  if (parent_block >= 0) {
    const Block& parent = at(parent_block);
    if (!parent.cached) return false;
    parent_gen = parent.gen;
  }
  if (const int32_t holder = by_hash_.find(hash); holder >= 0) {
    // A name held by a block whose parent has since lost its contents is
    // unreachable: free the name for this block when nobody uses the holder.
    const Block& h = blocks_[static_cast<size_t>(holder)];
    const bool orphan = h.parent >= 0 && (!blocks_[static_cast<size_t>(h.parent)].cached ||
                                          blocks_[static_cast<size_t>(h.parent)].gen != h.parent_gen);
    if (!orphan || h.ref > 0) return false;
    lru_remove(holder);
    uncache(holder);
    clean_.push_back(holder);
  }
  blk.cached = true;
  blk.hash = hash;
  blk.parent = parent_block;
  blk.parent_gen = parent_gen;
  std::copy(tokens, tokens + block_size_, block_tokens_for_write(block));
  by_hash_.insert(hash, block);
  if (parent_block < 0 && roots_.insert(hash, block) && root_observer_) root_observer_(tokens, true);
  return true;
}

int32_t* BlockAllocator::block_tokens_for_write(int32_t b) {
  const auto chunk = static_cast<size_t>(b / kTokenChunkBlocks);
  while (token_chunks_.size() <= chunk)  // grows with the blocks handed out
    token_chunks_.push_back(std::make_unique<int32_t[]>(static_cast<size_t>(kTokenChunkBlocks) * block_size_));
  return token_chunks_[chunk].get() + static_cast<ptrdiff_t>(b % kTokenChunkBlocks) * block_size_;
}

bool BlockAllocator::holds(int32_t b, const int32_t* tokens, int32_t parent) const {
  const Block& blk = blocks_[static_cast<size_t>(b)];
  const int32_t* have = block_tokens(b);
  if (!std::equal(tokens, tokens + block_size_, have)) return false;
  if (blk.parent != parent) return false;
  return parent < 0 || blk.parent_gen == blocks_[static_cast<size_t>(parent)].gen;
}

int32_t BlockAllocator::match(uint64_t hash, const int32_t* tokens, int32_t parent) const {
  const int32_t b = by_hash_.find(hash);
  return b >= 0 && holds(b, tokens, parent) ? b : -1;
}

std::vector<int32_t> BlockAllocator::find_prefix(const std::vector<uint64_t>& hashes, const int32_t* tokens,
                                                 int32_t max_blocks) const {
  std::vector<int32_t> found;
  if (!prefix_caching_) return found;
  const int32_t n = std::min<int32_t>(max_blocks, static_cast<int32_t>(hashes.size()));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = match(hashes[static_cast<size_t>(i)], tokens + static_cast<ptrdiff_t>(i) * block_size_,
                            found.empty() ? -1 : found.back());
    if (b < 0) break;
    found.push_back(b);
  }
  return found;
}

int32_t BlockAllocator::cached_prefix_length(const int32_t* tokens, int32_t max_blocks) const {
  if (!prefix_caching_ || roots_.empty() || max_blocks < 1) return 0;
  // The first block can only be a root: look it up among the roots, a far
  // smaller table than all names (placement asks every worker, most miss).
  uint64_t hash = hash_block(0, tokens);
  int32_t parent = roots_.find(hash);
  if (parent < 0 || !holds(parent, tokens, -1)) return 0;
  int32_t i = 1;
  for (; i < max_blocks; ++i) {  // each name hashed only once its parent matched
    const int32_t* block = tokens + static_cast<ptrdiff_t>(i) * block_size_;
    hash = hash_block(hash, block);
    parent = match(hash, block, parent);
    if (parent < 0) break;
  }
  return i;
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
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (blocks_[b].cached) uncache(static_cast<int32_t>(b));
  }
}

void BlockAllocator::check_invariants() const {
  std::vector<char> seen(static_cast<size_t>(num_blocks_), 0);
  const auto handed_out = static_cast<int32_t>(blocks_.size());
  if (handed_out > num_blocks_) fail("more blocks handed out than the pool holds");
  for (int32_t b = handed_out; b < num_blocks_; ++b) seen[static_cast<size_t>(b)] = 1;  // never handed out
  for (int32_t b : clean_) {
    if (b < 0 || b >= handed_out) fail("clean list holds bad id " + std::to_string(b));
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
  for (int32_t b = 0; b < handed_out; ++b) {
    const Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.ref < 0) fail("negative ref on block " + std::to_string(b));
    if (blk.ref == 0 && !seen[static_cast<size_t>(b)])
      fail("block " + std::to_string(b) + " leaked (ref 0, not free)");
    if (blk.ref > 0 && seen[static_cast<size_t>(b)])
      fail("used block " + std::to_string(b) + " is on a free list");
    if (blk.cached) {
      ++cached;
      if (by_hash_.find(blk.hash) != b) fail("hash map misses cached block " + std::to_string(b));
    }
  }
  if (cached != by_hash_.size()) fail("hash map holds stale entries");
  size_t roots = 0;
  for (int32_t b = 0; b < handed_out; ++b) {
    const Block& blk = blocks_[static_cast<size_t>(b)];
    if (!blk.cached || blk.parent >= 0) continue;
    ++roots;
    if (roots_.find(blk.hash) != b) fail("root index misses cached first block " + std::to_string(b));
  }
  if (roots != roots_.size()) fail("root index holds stale entries");
  if (num_free() + num_used() != num_blocks_) fail("free + used != total");
}

}  // namespace troupe::core
