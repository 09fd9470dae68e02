#pragma once
// BlockAllocator: the bookkeeping of one worker's paged KV pool (PagedAttention,
// Kwon et al., SOSP'23) with automatic prefix caching (vLLM V1's KV block pool).
//
// A block is `block_size` token slots. Every block is in exactly one state:
//
//   clean free ──allocate──▶ used (ref ≥ 1) ──release to ref 0──▶ clean free
//                             │   ▲                                (no hash)
//                  register   │   │ share (cache hit)
//                  (full)     ▼   │
//                          used+cached ──release to ref 0──▶ evictable (LRU)
//                                                               │
//                        allocate, no clean block left: evict ◀─┘ (hash dropped)
//
// A full block is named by a chained hash: hash(parent block's hash, its token
// ids), keyed with a per-allocator random key (XXH3-64 with a seed), so
// nobody outside the process can craft two prefixes with one name. A hash is
// only a name, never a proof: a lookup accepts a cached block only when its
// own tokens equal the query's and its parent is, by identity, the block
// accepted one level up (each block remembers the block its K/V were computed
// after, and a generation that changes whenever a block is given new
// contents). So even a hash collision cannot hand out K/V computed under
// another prefix (the class of bug of vLLM's GHSA-rm76-4mrf-v9r8); it can
// only cost a cache miss.
//
// Cached blocks whose owners are all gone stay in an LRU and can be shared
// again until the pool needs them; clean blocks are always handed out before a
// cached one is evicted: most recently freed first (a stack), then blocks
// never used, lowest id first, so the working set of the pool stays small and
// untouched blocks are never paged in (here or in the KV pool they index).
//
// Pure bookkeeping: no tensors, no threads. The owner (the scheduler) decides
// when a block's contents are valid before it registers the block.
#include <cstdint>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "core/chunked_array.hpp"
#include "core/name_index.hpp"

namespace troupe::core {

class BlockAllocator {
 public:
  // hash(key, parent_hash, tokens, n): a block's name. Replaceable for tests
  // that force collisions.
  using HashFn =
      std::function<uint64_t(uint64_t key, uint64_t parent_hash, const int32_t* tokens, int32_t n)>;

  // num_blocks >= 1, block_size >= 1; without prefix caching register_block is
  // a no-op and find_prefix never hits. hash_key 0 = a random key for this
  // allocator (the names of blocks are then unpredictable outside it).
  BlockAllocator(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching = true,
                 uint64_t hash_key = 0);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }

  int32_t num_free() const {  // ref 0
    return num_blocks_ - static_cast<int32_t>(blocks_.size()) + static_cast<int32_t>(clean_.size()) +
           num_evictable_;
  }
  int32_t num_used() const { return num_blocks_ - num_free(); }  // ref >= 1
  int32_t num_evictable() const { return num_evictable_; }       // cached with ref 0 (in the LRU)
  int32_t num_cached() const { return static_cast<int32_t>(by_hash_.size()); }  // holding a hash, any ref
  int32_t ref_count(int32_t block) const { return at(block).ref; }
  bool is_cached(int32_t block) const { return at(block).cached; }

  // A block with ref 1: the most recently freed clean one if any, else the
  // least recently released cached one (its hash is forgotten). -1 when every
  // block is in use.
  int32_t allocate();
  // All-or-nothing: appends n blocks to `out`, or changes nothing and returns false.
  bool allocate(int32_t n, std::vector<int32_t>& out);
  // Drops one reference. At ref 0 a cached block joins the LRU tail, an
  // uncached one the clean stack. Throws std::logic_error on a free block.
  void release(int32_t block);
  // Releases a sequence's blocks tail first, so that its last (least shared)
  // blocks are evicted before its prefix.
  void release_all(const std::vector<int32_t>& blocks);
  // One more owner of a cached block (a prefix-cache hit); takes it out of the
  // LRU when its ref was 0.
  void share(int32_t block);

  // The chained name of a full block (block_size tokens) given its parent's
  // name (0 for the first block of a sequence).
  uint64_t hash_block(uint64_t parent_hash, const int32_t* tokens) const;
  // Names a used, full block whose K/V were computed after `parent_block`
  // (-1 for a sequence's first block), so that later sequences can share it.
  // `hash` must be hash_block(parent's hash, tokens). Returns false (and
  // changes nothing) when caching is off, the block is already cached,
  // another block holds this name, or the parent is not cached (a block is
  // only reachable through its own, cached parent).
  bool register_block(int32_t block, int32_t parent_block, uint64_t hash, const int32_t* tokens);
  // Starts fetching what register_block(block, .., hash, ..) reads first (a
  // caller about to register blocks of many sequences asks for all of them).
  void prefetch_register(int32_t block, uint64_t hash) const {
    if (block >= 0 && static_cast<size_t>(block) < blocks_.size())
      __builtin_prefetch(&blocks_[static_cast<size_t>(block)]);
    if (block >= 0 && static_cast<size_t>(block / kTokenChunkBlocks) < token_chunks_.size())
      __builtin_prefetch(block_tokens(block), 1);  // written there
    by_hash_.prefetch(hash);
  }
  // The longest run of cached blocks for the query's full blocks
  // hashes[0..max_blocks) with tokens tokens[0..max_blocks * block_size): each
  // found by name, its tokens equal to the query's, and its parent the block
  // found one level up (identity, not name). Changes nothing.
  std::vector<int32_t> find_prefix(const std::vector<uint64_t>& hashes, const int32_t* tokens,
                                   int32_t max_blocks) const;
  // How many blocks find_prefix would find for tokens[0, max_blocks *
  // block_size), hashing each block's name only when its parent matched
  // (placement asks every worker, and most miss on the first block).
  int32_t cached_prefix_length(const int32_t* tokens, int32_t max_blocks) const;
  // Counts one admission's lookup: `queried` full blocks asked for, `hit` found.
  void record_lookup(int32_t queried, int32_t hit);
  // Forgets every name (the KV contents are gone, e.g. a lost worker). Blocks
  // in the LRU become clean; used blocks keep their owners.
  void clear_cache();

  int64_t hit_blocks() const { return hit_blocks_; }
  int64_t miss_blocks() const { return miss_blocks_; }
  int64_t evictions() const { return evictions_; }

  // Replaces the hash function (tests: force collisions). Call before any register_block.
  void set_hash_function(HashFn fn) { hash_fn_ = std::move(fn); }  // (hash_fn_ non-empty: used instead of XXH3)

  // Told whenever a first block (no parent) gains its name (cached = true,
  // register_block) or loses it (false: evicted, replaced, cleared), with
  // the block's block_size tokens: the batcher's cluster-wide index of first
  // blocks (core/prefix_root_index.hpp) follows every worker's through it.
  // Call before any register_block.
  using RootObserver = std::function<void(const int32_t* tokens, bool cached)>;
  void set_root_observer(RootObserver fn) { root_observer_ = std::move(fn); }

  // Throws std::logic_error when the free lists, LRU, hash map or counters disagree.
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref = 0;
    bool cached = false;
    uint64_t hash = 0;
    int32_t parent = -1;      // block whose K/V preceded this one's when it was computed; -1 = first
    uint32_t parent_gen = 0;  // the parent's generation at registration
    uint32_t gen = 0;         // bumped whenever the block loses its name (evicted, cleared)
    int32_t lru_prev = -1, lru_next = -1;  // LRU links while evictable
  };
  // Block `block`'s state (throws std::out_of_range outside the pool); a
  // block never handed out reads as free and uncached.
  const Block& at(int32_t block) const {
    if (block < 0 || block >= num_blocks_) out_of_pool(block);
    static const Block kFresh;  // never handed out: free, uncached
    return static_cast<size_t>(block) < blocks_.size() ? blocks_[static_cast<size_t>(block)] : kFresh;
  }
  [[noreturn]] void out_of_pool(int32_t block) const;  // throws std::out_of_range
  void lru_push_back(int32_t b);
  void lru_remove(int32_t b);
  void uncache(int32_t b);
  // Whether cached block b holds `tokens` (block_size ids) and its K/V were
  // computed after `parent` (-1: first) as that block is now.
  bool holds(int32_t b, const int32_t* tokens, int32_t parent) const;
  // The cached block named `hash` that holds(tokens, parent); -1 when there is none.
  int32_t match(uint64_t hash, const int32_t* tokens, int32_t parent) const;

  int32_t num_blocks_;
  int32_t block_size_;
  bool prefix_caching_;
  uint64_t hash_key_;
  HashFn hash_fn_;  // a test's replacement; empty: XXH3 called directly (every block is named)
  RootObserver root_observer_;
  // Blocks are handed out in id order the first time (blocks_ grows by one
  // each), so the pool's bookkeeping, like its KV, follows use: ids from
  // blocks_.size() up were never handed out and are free.
  ChunkedArray<Block, 256> blocks_;
  std::vector<int32_t> clean_;  // stack of clean free blocks once used, most recently freed on top
  // The token ids of each cached block, block_size a block, in chunks of
  // kTokenChunkBlocks blocks made as blocks are first registered (they never move).
  static constexpr int32_t kTokenChunkBlocks = 64;
  std::vector<std::unique_ptr<int32_t[]>> token_chunks_;
  const int32_t* block_tokens(int32_t b) const {
    return token_chunks_[static_cast<size_t>(b / kTokenChunkBlocks)].get() +
           static_cast<ptrdiff_t>(b % kTokenChunkBlocks) * block_size_;
  }
  int32_t* block_tokens_for_write(int32_t b);  // makes its chunk (and those before) when missing
  NameIndex by_hash_;
  NameIndex roots_;  // the cached blocks with no parent (a sequence's first), also in by_hash_
  int32_t lru_head_ = -1, lru_tail_ = -1;  // head = least recently released
  int32_t num_evictable_ = 0;
  int64_t hit_blocks_ = 0, miss_blocks_ = 0, evictions_ = 0;
};

}  // namespace troupe::core
