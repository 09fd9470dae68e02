#pragma once
// PagedKvCache: the K/V of many sequences in fixed-size blocks (Kwon et al.,
// "Efficient Memory Management for Large Language Model Serving with
// PagedAttention", SOSP 2023). A sequence's tokens live in the blocks its block
// table names; slot = block * block_size + offset. Who owns which block is the
// scheduler's business (BlockAllocator); this class only holds the memory.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "model/config.hpp"
#include "model/kv_prefault.hpp"
#include "model/linear.hpp"

namespace troupe::model {

// What a KV slot stores (vLLM's --kv-cache-dtype). bfloat16 halves the bytes
// a decode step reads and doubles the tokens a --kv-memory holds; K and V
// are rounded to it (to nearest, ties to even) when written and widened to
// fp32 in the attention kernel's registers.
enum class KvDtype { kFloat32, kBFloat16 };
// "auto" (the weights' storage: bfloat16 for bfloat16 weights, else
// float32), "float32"/"fp32", "bfloat16"/"bf16"; std::invalid_argument otherwise.
KvDtype parse_kv_cache_dtype(const std::string& name, WeightDtype weights);
const char* to_string(KvDtype dtype);
int64_t element_bytes(KvDtype dtype);

class PagedKvCache {
 public:
  // num_blocks >= 1, block_size >= 1. Allocates 2 * n_layer pools of
  // num_blocks * block_size * n_embd `dtype` values on `device`, uninitialised:
  // a slot holds garbage until its token's K/V is written. On the CPU the
  // pools are reserved without being touched, so resident memory follows
  // the blocks in use and the pages map_ahead was asked for (never-written
  // pages read as zeros).
  PagedKvCache(const Gpt2Config& config, int64_t num_blocks, int64_t block_size = 16,
               torch::Device device = torch::kCPU, KvDtype dtype = KvDtype::kFloat32);

  // Bytes one block takes over all layers, K and V.
  static int64_t bytes_per_block(const Gpt2Config& config, int64_t block_size,
                                 KvDtype dtype = KvDtype::kFloat32);
  // How many blocks fit in `bytes` (rounded down; may be 0).
  static int64_t blocks_for_memory(const Gpt2Config& config, int64_t bytes, int64_t block_size = 16,
                                   KvDtype dtype = KvDtype::kFloat32);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_slots() const { return num_blocks_ * block_size_; }
  int64_t bytes() const { return bytes_per_block(config_, block_size_, dtype_) * num_blocks_; }
  KvDtype dtype() const { return dtype_; }
  int n_layer() const { return config_.n_layer; }
  int n_head() const { return config_.n_head; }
  int head_dim() const { return config_.head_dim(); }
  torch::Device device() const { return device_; }

  // Pools of one layer: [num_blocks, n_head, block_size, head_dim], contiguous,
  // so one head's block is one contiguous block_size x head_dim tile; fp32
  // or bfloat16 (dtype()).
  const torch::Tensor& k(int layer) const { return k_.at(static_cast<size_t>(layer)); }
  const torch::Tensor& v(int layer) const { return v_.at(static_cast<size_t>(layer)); }

  // Writes k, v ([T, n_head, head_dim] fp32, last dim contiguous, on the
  // cache's device) into slots ([T] int64), rounded to the cache's dtype.
  // On the CPU the slots are range-checked
  // (std::invalid_argument); elsewhere the caller must have checked them.
  void write(int layer, const torch::Tensor& slots, const torch::Tensor& k, const torch::Tensor& v);
  // What write() does off the CPU (index_put_ on the pools, no range check);
  // public so that path is tested on the CPU too.
  void write_with_torch_ops(int layer, const torch::Tensor& slots, const torch::Tensor& k,
                            const torch::Tensor& v);

  // A step is about to write blocks up to `highest` (-1: none yet, which
  // still maps the first pages): the CPU pools' pages up to
  // kPrefaultAheadBlocks past its end get mapped on the cache's thread
  // (kv_prefault.hpp), so that later steps' first writes there fault no
  // pages in. Returns at once; does nothing off the CPU. StepExecutor calls
  // it for steps that write a block (TROUPE_KV_PREFAULT unset or 1).
  void map_ahead(int64_t highest);
  // Blocks until the pages asked for are mapped (tests).
  void wait_mapped();
  // Starts mapping every CPU pool whole on the cache's thread and returns at
  // once (TROUPE_KV_PREFAULT=all: StepExecutor, when the worker starts; not
  // waited for, so that a worker's first step, whose deadline the head counts
  // from when it sends the plan, is not held up by it). Steps meanwhile fault
  // in what they write first; later map_ahead() calls ask for nothing. Where
  // the kernel cannot populate (before Linux 5.14) the pages fault in at
  // their first write, as without it.
  void map_whole();
  // Bytes of each pool asked to be mapped so far (0: none).
  int64_t mapped_ahead_bytes() const { return prefault_policy_.asked(); }
  // Blocks written ahead of which the pools are mapped (per pool, rounded
  // up to whole 2 MiB pages: the next page of each pool is mapped once the
  // blocks written come within this many of its start): 160 tokens, 480 KiB
  // of each pool of GPT-2 124M in fp32, 240 KiB in bfloat16. Served on the
  // Xeon (fp32, 2 MiB pages, 40 requests at 1 req/s, three rounds
  // alternating): median TTFT 298, 278, 279 ms at 512 KiB ahead, 319, 304,
  // 291 at 4 MiB, 361, 319, 328 without; peak RSS 1308-1318 MiB, 1414 and
  // 1325-1327. Counted in blocks, not bytes, so that a bfloat16 pool maps no
  // further ahead in tokens, nor holds more unused at the end of a run
  // (docs/notes/2026-12-06-kv-prefault.md).
  static constexpr int64_t kPrefaultAheadBlocks = 10;

 private:
  Gpt2Config config_;
  int64_t num_blocks_;
  int64_t block_size_;
  torch::Device device_;
  KvDtype dtype_ = KvDtype::kFloat32;
  std::vector<torch::Tensor> k_, v_;
  KvPrefaultPolicy prefault_policy_{0, 1, 0, 1};  // set for CPU pools
  std::unique_ptr<PagePrefaulter> prefaulter_;    // after the pools: stops before they go
};

}  // namespace troupe::model
