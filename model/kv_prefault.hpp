#pragma once
// Mapping the KV pools' pages ahead of the blocks in use, off the step's path.
//
// A CPU pool is reserved untouched (paged_kv_cache.cpp): its pages are mapped
// at their first write, so resident memory follows the blocks in use. The
// first write to a page costs its fault, though, and a block never used
// before is first written in the middle of a step: fresh blocks are handed
// out lowest id first, and with prefix caching freed blocks stay cached, so
// a worker walks into new pages all through its first pass over the pool.
// In 2 MiB pages each new page of every layer's K and V at once (48 MiB for
// GPT-2 124M in fp32) took a step 110-150 ms longer on the Xeon VM, about 45
// times in a 160-request run of a 2048-block pool (a VM's first touch of
// memory can be slow: 300 ms to populate 96 MiB there;
// docs/notes/2026-12-06-kv-prefault.md).
//
// So the worker maps a few pages ahead of the highest block it has written
// (KvPrefaultPolicy decides how far), and a thread of the cache does it
// (PagePrefaulter: madvise(MADV_POPULATE_WRITE), which maps pages without
// writing them, so it may run while steps write the blocks before it).
// Resident memory still follows use, plus the pages ahead. TROUPE_KV_PREFAULT=0
// turns it off (for measuring); TROUPE_KV_PREFAULT=all starts mapping every
// pool whole when the worker starts instead, on the same thread (resident
// memory is then --kv-memory within seconds of the start, as a server that
// allocates its KV cache up front holds it, and once it is done no step meets
// a new page; on the Xeon VM, where memory the guest has not used lately is
// first written at ~330 MB/s, a 2.4 GiB pool takes ~7 s).
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace troupe::model {

enum class KvPrefault {
  kOff,    // pages fault in at their first write
  kAhead,  // mapped ahead of the blocks written (the default)
  kWhole,  // every pool mapped whole when the worker starts
};

// TROUPE_KV_PREFAULT: unset or "1" -> kAhead, "0" -> kOff, "all" -> kWhole;
// anything else throws std::invalid_argument naming the variable (troupe
// refuses to start).
KvPrefault kv_prefault_from(const char* value);
// The process's setting (read once).
KvPrefault kv_prefault_mode();

// How much of each pool should be mapped (functional core of
// PagedKvCache::map_ahead). A pool holds block b in bytes
// [b * block_bytes, (b + 1) * block_bytes); every pool of a cache alike.
class KvPrefaultPolicy {
 public:
  // pool_bytes >= 0, block_bytes >= 1, ahead_bytes >= 0, page_bytes >= 1
  // (std::invalid_argument otherwise).
  KvPrefaultPolicy(int64_t pool_bytes, int64_t block_bytes, int64_t ahead_bytes, int64_t page_bytes);

  // A step writes blocks up to `highest` (-1: none yet, at the start). Returns
  // the prefix of each pool, in bytes, that should now be mapped: the end of
  // that block plus ahead_bytes, rounded up to whole pages, at most the pool;
  // 0 when an earlier answer already covers it.
  int64_t on_write(int64_t highest);
  // The largest prefix asked for so far.
  int64_t asked() const { return asked_; }

 private:
  int64_t pool_bytes_, block_bytes_, ahead_bytes_, page_bytes_;
  int64_t asked_ = 0;
};

// Maps prefixes of some ranges of this process's anonymous memory (the
// pools) on a thread of its own, started at the first request.
class PagePrefaulter {
 public:
  // Each range: its start and length in bytes. They must stay mapped for
  // the prefaulter's life.
  explicit PagePrefaulter(std::vector<std::pair<char*, size_t>> ranges, size_t piece_bytes = size_t{2} << 20);
  ~PagePrefaulter();  // stops at the piece it is on, and joins
  PagePrefaulter(const PagePrefaulter&) = delete;
  PagePrefaulter& operator=(const PagePrefaulter&) = delete;

  // Every range's first `bytes` (clamped to its length) should be mapped;
  // returns at once. Piece by piece, each piece in every range in turn.
  void request(size_t bytes);
  // Blocks until what was requested is mapped, or prefaulting failed.
  void wait();
  // Whether the kernel refused (before Linux 5.14 there is no
  // MADV_POPULATE_WRITE): the pages then fault in at their first write, as
  // without a prefaulter.
  bool failed() const;
  // Bytes of each range mapped so far.
  size_t done() const;

 private:
  void loop();

  std::vector<std::pair<char*, size_t>> ranges_;
  size_t piece_bytes_;
  size_t limit_ = 0;  // the longest range
  mutable std::mutex mu_;
  std::condition_variable wake_, settled_;
  size_t target_ = 0, done_ = 0;
  bool stop_ = false, failed_ = false;
  std::thread thread_;
};

}  // namespace troupe::model
