#pragma once
// ChunkedArray: an array that grows at its end in chunks of kChunk elements
// that never move. A std::vector that doubles copies everything it holds into
// memory new to the process each time; in the simulator a thousand workers'
// block pools grow that way for minutes, and those copies (and the kernel's
// clearing of the new pages) were most of the memory traffic of a 1000-worker
// run. Here growing allocates one chunk; memory still follows use. Indexing
// reads one more pointer (from a small table that stays in cache).
// Torch-free, no threads.
#include <cstddef>
#include <memory>
#include <vector>

namespace troupe::core {

template <typename T, size_t kChunk>
class ChunkedArray {
  static_assert(kChunk > 0 && (kChunk & (kChunk - 1)) == 0, "kChunk must be a power of two");

 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return chunks_[i / kChunk][i % kChunk]; }
  const T& operator[](size_t i) const { return chunks_[i / kChunk][i % kChunk]; }
  // Appends a value-initialised element and returns it.
  T& emplace_back() {
    if (size_ == chunks_.size() * kChunk) chunks_.push_back(std::make_unique<T[]>(kChunk));
    T& x = (*this)[size_++];
    x = T{};
    return x;
  }

 private:
  std::vector<std::unique_ptr<T[]>> chunks_;
  size_t size_ = 0;
};

}  // namespace troupe::core
