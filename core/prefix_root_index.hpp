#pragma once
// PrefixRootIndex: which workers hold a cached first block (a sequence's
// first block_size tokens) with given contents, cluster-wide. The batcher
// keeps it from every worker's BlockAllocator (set_root_observer), so that
// prefix-affinity placement asks only the workers that can have a hit instead
// of every worker's allocator (a cache miss each: placement cost grew with
// the cluster). A worker holds at most one first block per contents; the
// index is exact for those, and a lookup may also name workers whose first
// block merely shares the hash (the allocator's own lookup then says 0).
// Torch-free, no threads.
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace troupe::core {

class PrefixRootIndex {
 public:
  // Worker `worker` now holds (add) or no longer holds (remove) a first block
  // with tokens[0, n). Each remove follows its add.
  void add(uint64_t worker, const int32_t* tokens, int32_t n);
  void remove(uint64_t worker, const int32_t* tokens, int32_t n);
  // Forgets every entry of a worker (it left the cluster).
  void remove_worker(uint64_t worker);
  // The workers that may hold a first block equal to tokens[0, n) (each
  // once per block of theirs under this hash: a worker can repeat when two
  // of its first blocks collide); null when none can.
  const std::vector<uint64_t>* holders(const int32_t* tokens, int32_t n) const;
  size_t size() const { return entries_; }  // (worker, first block) pairs held

 private:
  static uint64_t key(const int32_t* tokens, int32_t n);
  std::unordered_map<uint64_t, std::vector<uint64_t>> by_key_;
  size_t entries_ = 0;
};

}  // namespace troupe::core
