#pragma once
// Linear: y = x @ W + b for one weight matrix W [in, out], fp32, with W packed
// once for the CPU's packed GEMM kernel: AVX-512 (6 x 64 tiles) or AVX2 + FMA
// (6 x 16 tiles), whichever variant the process runs (cpu_features.hpp); the
// layout is the variant's (linear_kernel.hpp), so a Linear is packed for one
// variant and keeps it for its lifetime.
//
// Why not OpenBLAS: its kernels run small-M GEMMs (the decode of a few
// sequences) at a fraction of the memory bandwidth, and dip at M = 64 on AVX2
// machines (bench/bench_linear.cpp measures both, per variant).
//
// Threads (at::parallel_for) take disjoint column panels, so any thread count
// gives the same bits; they are only real threads when this library is
// compiled with -fopenmp (ATen's OpenMP parallel_for is a header template).
//
// Everything else — the portable variant, a weight not fp32 or not on the
// CPU, or a Linear built with pack = false — keeps W as given and calls
// at::addmm / at::addmv (GEMV for a single row), so other devices work.
#include <cstdint>
#include <string>

#include <torch/types.h>

#include "model/cpu_features.hpp"

namespace troupe::model {

struct PackedGemmKernel;

// How the source tensor holds W.
enum class WeightLayout {
  kInOut,  // [in, out]: Hugging Face Conv1D (GPT-2's c_attn, c_proj, c_fc)
  kOutIn,  // [out, in]: an output head tied to an embedding (GPT-2's wte)
};

// The weights' storage. float32 and bfloat16 are vLLM's --dtype names, int8
// its --quantization int8. bfloat16 halves the bytes a step streams: the
// packed kernels widen each weight to fp32 in registers and compute exactly
// as for fp32 weights equal to the rounded ones. int8 quarters them:
// symmetric int8 with one fp32 scale per output channel
// (quantize_int8_per_channel), widened to fp32 in registers, each output's
// fp32 sum of x * q multiplied by its channel's scale in the epilogue.
// int8_g32 is llama.cpp Q8_0's layout: an fp32 scale per group of 32 inputs
// of each output channel (quantize_int8_groups_of_32; 1.125 bytes a weight),
// each weight dequantized in registers (q * its group's scale) before the
// fp32 kernel's FMAs.
enum class WeightDtype { kFloat32, kBFloat16, kInt8, kInt8G32 };
// "float32" / "bfloat16" / "int8" / "int8_g32" (also "fp32", "bf16");
// std::invalid_argument otherwise.
WeightDtype parse_weight_dtype(const std::string& name);
const char* to_string(WeightDtype dtype);
// `t` rounded to bfloat16 (to nearest, ties to even) and back to fp32: the
// values a bfloat16 weight holds.
torch::Tensor round_to_bfloat16(const torch::Tensor& t);
// `t` (fp32, in `layout`) through symmetric int8 per output channel and back:
// scale[n] = max over the inputs of |W[., n]| / 127 (fp32), q = W / scale
// rounded to nearest (ties to even) and clamped to [-127, 127], returned as
// q * scale in fp32 (one rounding) — the values an int8 weight stands for,
// and exactly what an int8 Linear's embedding() returns. A channel of zeros
// has scale 0 and stays 0. For wte [vocab, n_embd] (kOutIn) a channel is a
// vocabulary row.
torch::Tensor quantize_int8_per_channel(const torch::Tensor& t, WeightLayout layout);
// The same with a scale per group of kInt8Group consecutive inputs of each
// output channel (the last group of a channel may be shorter): llama.cpp
// Q8_0's blocks, with fp32 scales. Exactly the values an int8_g32 Linear
// multiplies by, and its embedding() returns.
constexpr int64_t kInt8Group = 32;
torch::Tensor quantize_int8_groups_of_32(const torch::Tensor& t, WeightLayout layout);

// Each thread's kernel scratch (the AVX-512 BF16 variant's rows of x in 16
// bits, sized for the largest step the thread ran: 5.5 MiB a thread after a
// 900-token prefill of GPT-2 124M) is freed at the thread's next product and
// allocated again at that product's size. Thread-safe; costs one allocation a
// thread. StepExecutor calls it with core::release_free_heap.
void release_kernel_scratch();

// What forward applies to x @ W + bias.
enum class Activation {
  kNone,
  // GPT-2's "gelu_new": 0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3))).
  // Packed, in the kernel's epilogue while the tile is in registers (as y *
  // sigmoid(2u), within a few ulp of at::gelu(y, "tanh")); else at::gelu.
  kGeluTanh,
};

class Linear {
 public:
  Linear() = default;
  // Packs `weight` for the process's kernel variant (kernel_isa()) when
  // `pack` is true; pack = false keeps it for BLAS. Same as
  // Linear(weight, layout, pack ? kernel_isa() : CpuIsa::kPortable).
  Linear(const torch::Tensor& weight, WeightLayout layout, bool pack = true);
  // Copies `weight` into `isa`'s packed layout when it is an fp32 CPU tensor
  // and isa has a packed kernel (avx2, avx512); otherwise keeps (a contiguous
  // view of) it for at::addmm. The source is not referenced after packing.
  // Throws std::invalid_argument when this CPU cannot run `isa`.
  Linear(const torch::Tensor& weight, WeightLayout layout, CpuIsa isa);
  // The same with the weight stored as `dtype`: packed bfloat16 (half the
  // bytes) or int8 + per-channel scales (a quarter) where a packed kernel
  // serves it; elsewhere fp32 rounded to bfloat16's values or holding
  // quantize_int8_per_channel's, so every variant computes the same function
  // (int8: up to the fp32 rounding of the sums, the scale applied after).
  // A 16-bit `weight` (a BF16 or F16 file's matrix) makes a bfloat16 or int8
  // Linear (std::invalid_argument for float32): the same Linear as from its
  // values widened to fp32, without a whole fp32 copy (bfloat16 bits are
  // packed as they are; int8 quantizes a block of channels at a time).
  Linear(const torch::Tensor& weight, WeightLayout layout, CpuIsa isa, WeightDtype dtype);

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool packed() const { return kernel_ != nullptr; }  // a packed kernel serves this weight
  WeightDtype dtype() const { return dtype_; }
  // As stored (int8: with the scales).
  int64_t weight_bytes() const {
    return (weight_.defined() ? weight_.nbytes() : 0) + (scales_.defined() ? scales_.nbytes() : 0);
  }
  // The variant serving this weight: kPortable when it goes through BLAS.
  CpuIsa isa() const { return isa_; }
  torch::Device device() const;

  // x [M, in] @ W + bias -> [M, out]. bias is [out] or undefined (none).
  // Packed: x must be fp32 on the CPU (any strides); a wrong shape, dtype or
  // device throws std::invalid_argument.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& bias = {},
                        Activation act = Activation::kNone) const;
  // out [M, out] += x @ W + bias, in place (a residual add).
  void forward_add_(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& bias = {}) const;

  // Rows `ids` of W^T, i.e. [ids.size(0), in]: what an embedding tied to this
  // output layer looks up (GPT-2 reads token embeddings from its LM head), so
  // the model needs no second copy of wte. ids: 1-D integer tensor, each in
  // [0, out) (else std::invalid_argument / index_select's error).
  torch::Tensor embedding(const torch::Tensor& ids) const;

 private:
  void check_args(const torch::Tensor& x, const torch::Tensor& bias, const char* who) const;
  torch::Tensor forward_blas(const torch::Tensor& x, const torch::Tensor& bias) const;  // unpacked weight
  // C [M, out] (row stride ldc) = or += x @ W + bias, on the packed weight.
  void run_packed(const torch::Tensor& x, const torch::Tensor& bias, float* c, int64_t ldc, bool accumulate,
                  bool gelu = false) const;

  torch::Tensor weight_;  // packed: [panels, in, nr] fp32, bfloat16 or int8; else fp32 (see the constructor)
  // Packed int8: [panels * nr] fp32, each column's scale (0 past out); packed
  // int8_g32: [panels, groups, nr], group g of column p * nr + j at [p][g][j];
  // else undefined.
  torch::Tensor scales_;
  WeightLayout layout_ = WeightLayout::kInOut;  // the source's layout (unpacked weight_ keeps it)
  WeightDtype dtype_ = WeightDtype::kFloat32;
  int64_t in_ = 0, out_ = 0;
  CpuIsa isa_ = CpuIsa::kPortable;
  const PackedGemmKernel* kernel_ = nullptr;  // null: BLAS
};

}  // namespace troupe::model
