#include "model/paged_kv_cache.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "model/kernel_team.hpp"

namespace troupe::model {
namespace {

constexpr int64_t kHugePage = int64_t{2} << 20;  // a pool's start is aligned to it

torch::ScalarType scalar_type(KvDtype dtype) {
  return dtype == KvDtype::kBFloat16 ? torch::kBFloat16 : torch::kFloat32;
}

// A CPU tensor whose memory is reserved but not touched: anonymous
// pages are mapped on their first write, so resident memory grows with the
// blocks sequences actually use, not with the pool (a 2 GiB pool costs
// nothing until it fills). A never-written page reads as zeros, though
// nothing reads a slot before its token's K/V is written there (the kernel
// reads only context positions; the gather path zeroes the padding it reads).
//
// The pool is 2 MiB-aligned and advised for transparent huge pages, so it
// fills in 2 MiB pages (about 42 blocks of one layer's K or V for GPT-2
// 124M): a decode step of 64 sequences at context 128 reads 604 MB of K/V
// scattered over the pool, and with 4 KiB pages the first such step after
// other work ran 81-200 ms instead of 63-65 (bench_limits, Zen 5: page walks
// over page tables the other work had evicted). Resident memory still
// follows use, in 2 MiB steps per pool. Without THP this is plain memory.
// A step's first write to a page maps it (the kernel clears it first), so a
// worker maps the pages ahead of its blocks on a thread (map_ahead).
torch::Tensor untouched_cpu_pool(const std::vector<int64_t>& shape, KvDtype dtype) {
  size_t bytes = static_cast<size_t>(element_bytes(dtype));
  for (int64_t d : shape) bytes *= static_cast<size_t>(d);
  constexpr size_t kHuge = static_cast<size_t>(kHugePage);
  const size_t reserved = bytes + kHuge;  // room to align the start
  void* mem =
      mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED)
    throw std::runtime_error("PagedKvCache: cannot reserve " + std::to_string(bytes >> 20) +
                             " MiB for a KV pool: " + std::strerror(errno) + "; lower the KV cache size");
  const uintptr_t base = reinterpret_cast<uintptr_t>(mem);
  void* start = reinterpret_cast<void*>((base + kHuge - 1) / kHuge * kHuge);
  madvise(start, bytes, MADV_HUGEPAGE);  // advice only
  return at::from_blob(
      start, shape, [mem, reserved](void*) { munmap(mem, reserved); },
      torch::TensorOptions().dtype(scalar_type(dtype)));
}

// One head's row of D values into the pool, as its dtype.
inline void store_row(float* dst, const float* src, int64_t D) {
  std::memcpy(dst, src, static_cast<size_t>(D) * sizeof(float));
}
inline void store_row(c10::BFloat16* dst, const float* src, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = c10::BFloat16(src[d]);  // to nearest, ties to even
}

}  // namespace

KvDtype parse_kv_cache_dtype(const std::string& name, WeightDtype weights) {
  if (name == "auto") return weights == WeightDtype::kBFloat16 ? KvDtype::kBFloat16 : KvDtype::kFloat32;
  if (name == "float32" || name == "fp32") return KvDtype::kFloat32;
  if (name == "bfloat16" || name == "bf16") return KvDtype::kBFloat16;
  throw std::invalid_argument("--kv-cache-dtype '" + name + "': expected auto, float32 or bfloat16");
}

const char* to_string(KvDtype dtype) { return dtype == KvDtype::kBFloat16 ? "bfloat16" : "float32"; }

int64_t element_bytes(KvDtype dtype) { return dtype == KvDtype::kBFloat16 ? 2 : 4; }

PagedKvCache::PagedKvCache(const Gpt2Config& config, int64_t num_blocks, int64_t block_size,
                           torch::Device device, KvDtype dtype)
    : config_(config), num_blocks_(num_blocks), block_size_(block_size), device_(device), dtype_(dtype) {
  config_.validate();
  if (num_blocks < 1)
    throw std::invalid_argument("PagedKvCache: num_blocks must be >= 1, got " + std::to_string(num_blocks));
  if (block_size < 1)
    throw std::invalid_argument("PagedKvCache: block_size must be >= 1, got " + std::to_string(block_size));
  const auto opts = torch::TensorOptions().dtype(scalar_type(dtype)).device(device);
  const std::vector<int64_t> shape{num_blocks, config_.n_head, block_size, config_.head_dim()};
  for (int l = 0; l < config_.n_layer; ++l) {
    k_.push_back(device.is_cpu() ? untouched_cpu_pool(shape, dtype) : at::empty(shape, opts));
    v_.push_back(device.is_cpu() ? untouched_cpu_pool(shape, dtype) : at::empty(shape, opts));
  }
  if (device.is_cpu()) {
    const int64_t block_bytes = config_.n_head * block_size * config_.head_dim() * element_bytes(dtype);
    prefault_policy_ = KvPrefaultPolicy(block_bytes * num_blocks, block_bytes,
                                        kPrefaultAheadBlocks * block_bytes, kHugePage);
    std::vector<std::pair<char*, size_t>> pools;
    for (const auto* set : {&k_, &v_})
      for (const torch::Tensor& t : *set)
        pools.emplace_back(static_cast<char*>(t.data_ptr()), static_cast<size_t>(block_bytes * num_blocks));
    prefaulter_ = std::make_unique<PagePrefaulter>(std::move(pools), static_cast<size_t>(kHugePage));
  }
}

void PagedKvCache::map_ahead(int64_t highest) {
  if (!prefaulter_) return;
  if (const int64_t bytes = prefault_policy_.on_write(highest); bytes > 0)
    prefaulter_->request(static_cast<size_t>(bytes));
}

void PagedKvCache::wait_mapped() {
  if (prefaulter_) prefaulter_->wait();
}

void PagedKvCache::map_whole() { map_ahead(num_blocks_ - 1); }  // the last block: every pool to its end

int64_t PagedKvCache::bytes_per_block(const Gpt2Config& config, int64_t block_size, KvDtype dtype) {
  if (block_size < 1)
    throw std::invalid_argument("PagedKvCache: block_size must be >= 1, got " + std::to_string(block_size));
  return 2 * static_cast<int64_t>(config.n_layer) * block_size * config.n_embd * element_bytes(dtype);
}

int64_t PagedKvCache::blocks_for_memory(const Gpt2Config& config, int64_t bytes, int64_t block_size,
                                        KvDtype dtype) {
  if (bytes < 0)
    throw std::invalid_argument("PagedKvCache: bytes must be >= 0, got " + std::to_string(bytes));
  return bytes / bytes_per_block(config, block_size, dtype);
}

void PagedKvCache::write(int layer, const torch::Tensor& slots, const torch::Tensor& k,
                         const torch::Tensor& v) {
  if (layer < 0 || layer >= config_.n_layer)
    throw std::invalid_argument("PagedKvCache::write: layer " + std::to_string(layer) + " out of range");
  const int64_t H = config_.n_head, D = config_.head_dim();
  if (slots.dim() != 1 || k.dim() != 3 || v.sizes() != k.sizes() || k.size(0) != slots.size(0) ||
      k.size(1) != H || k.size(2) != D)
    throw std::invalid_argument("PagedKvCache::write: want slots [T], k and v [T, n_head, head_dim]");
  if (k.scalar_type() != torch::kFloat32 || v.scalar_type() != torch::kFloat32 ||
      slots.scalar_type() != torch::kLong)
    throw std::invalid_argument("PagedKvCache::write: k, v must be fp32 and slots int64");
  const int64_t T = slots.size(0);
  if (T == 0) return;
  if (!device_.is_cpu() || !k.device().is_cpu() || !v.device().is_cpu() || !slots.device().is_cpu()) {
    write_with_torch_ops(layer, slots, k, v);
    return;
  }
  torch::Tensor s = slots.contiguous();
  const int64_t* sp = s.data_ptr<int64_t>();
  const int64_t n_slots = num_slots();
  for (int64_t t = 0; t < T; ++t)
    if (sp[t] < 0 || sp[t] >= n_slots)
      throw std::invalid_argument("PagedKvCache::write: slot " + std::to_string(sp[t]) +
                                  " is outside the pool of " + std::to_string(n_slots) + " slots");
  torch::Tensor kc = k.stride(2) == 1 ? k : k.contiguous();
  torch::Tensor vc = v.stride(2) == 1 ? v : v.contiguous();
  const float* ks = kc.data_ptr<float>();
  const float* vs = vc.data_ptr<float>();
  const int64_t ks0 = kc.stride(0), ks1 = kc.stride(1), vs0 = vc.stride(0), vs1 = vc.stride(1);
  const int64_t bs = block_size_;
  auto copy = [&](auto* kd, auto* vd) {
    kernel_parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t blk = sp[t] / bs, off = sp[t] % bs;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t dst = ((blk * H + h) * bs + off) * D;
          store_row(kd + dst, ks + t * ks0 + h * ks1, D);
          store_row(vd + dst, vs + t * vs0 + h * vs1, D);
        }
      }
    });
  };
  torch::Tensor& kp = k_[static_cast<size_t>(layer)];
  torch::Tensor& vp = v_[static_cast<size_t>(layer)];
  if (dtype_ == KvDtype::kBFloat16)
    copy(kp.data_ptr<c10::BFloat16>(), vp.data_ptr<c10::BFloat16>());
  else
    copy(kp.data_ptr<float>(), vp.data_ptr<float>());
}

void PagedKvCache::write_with_torch_ops(int layer, const torch::Tensor& slots, const torch::Tensor& k,
                                        const torch::Tensor& v) {
  if (layer < 0 || layer >= config_.n_layer)
    throw std::invalid_argument("PagedKvCache::write: layer " + std::to_string(layer) + " out of range");
  torch::Tensor& kp = k_[static_cast<size_t>(layer)];
  torch::Tensor& vp = v_[static_cast<size_t>(layer)];
  const torch::Tensor s = slots.to(device_);
  const torch::Tensor blk = at::div(s, block_size_, "floor");
  const torch::Tensor off = at::remainder(s, block_size_);
  // Advanced indices split by a slice put the indexed dims first: [T, H, D].
  // Caller checks slot range and shapes (write() does).
  using torch::indexing::Slice;
  kp.index_put_({blk, Slice(), off}, k.to(kp.scalar_type()));
  vp.index_put_({blk, Slice(), off}, v.to(vp.scalar_type()));
}

}  // namespace troupe::model
