#pragma once
// Linear: y = x @ W + b for one weight matrix W [in, out], fp32, with W packed
// once for an AVX-512 kernel on the CPU.
//
// Why not OpenBLAS: its AVX2 kernels run small-M GEMMs (the decode of a few
// sequences) at a fraction of the memory bandwidth, and M = 64..512 at half
// of what 512-bit FMAs reach (bench/bench_linear.cpp measures both).
//
// Packed layout: W's columns in panels of 64, each panel [in, 64] contiguous
// (the last one zero-padded). Tiles of up to 6 rows x 64 columns keep 24
// accumulators in zmm registers; all row tiles pass over a 384-row chunk of a
// panel while it sits in L2 and prefetch the next chunk meanwhile, so each
// weight comes from memory once per call and the stream overlaps the FMAs
// (Goto & van de Geijn, "Anatomy of high-performance matrix multiplication",
// 2008, with the packed panel in the role of B). Threads (at::parallel_for)
// take disjoint column panels, so any thread count gives the same bits; they
// are only real threads when this library is compiled with
// -fopenmp (ATen's OpenMP parallel_for is a header template).
//
// Everything else — a build without AVX-512, a weight not fp32 or not on the
// CPU, or a Linear built with pack = false — keeps W as given and calls
// at::addmm / at::addmv (GEMV for a single row), so other devices work.
#include <cstdint>

#include <torch/types.h>

namespace troupe::model {

// How the source tensor holds W.
enum class WeightLayout {
  kInOut,  // [in, out]: Hugging Face Conv1D (GPT-2's c_attn, c_proj, c_fc)
  kOutIn,  // [out, in]: an output head tied to an embedding (GPT-2's wte)
};

class Linear {
 public:
  Linear() = default;
  // Copies `weight` into the packed layout when it is an fp32 CPU tensor, the
  // build has AVX-512 and `pack` is true; otherwise keeps (a contiguous view
  // of) it for at::addmm. The source is not referenced after packing.
  Linear(const torch::Tensor& weight, WeightLayout layout, bool pack = true);

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool packed() const { return packed_; }  // the AVX-512 kernel serves this weight
  torch::Device device() const;

  // x [M, in] @ W + bias -> [M, out]. bias is [out] or undefined (none).
  // Packed: x must be fp32 on the CPU (any strides); a wrong shape, dtype or
  // device throws std::invalid_argument.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& bias = {}) const;
  // out [M, out] += x @ W + bias, in place (a residual add).
  void forward_add_(torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& bias = {}) const;

  // Rows `ids` of W^T, i.e. [ids.size(0), in]: what an embedding tied to this
  // output layer looks up (GPT-2 reads token embeddings from its LM head), so
  // the model needs no second copy of wte. ids: 1-D integer tensor, each in
  // [0, out) (else std::invalid_argument / index_select's error).
  torch::Tensor embedding(const torch::Tensor& ids) const;

 private:
  void check_args(const torch::Tensor& x, const torch::Tensor& bias, const char* who) const;
  // C [M, out] (row stride ldc) = or += x @ W + bias, on the packed weight.
  void run_packed(const torch::Tensor& x, const torch::Tensor& bias, float* c, int64_t ldc, bool accumulate) const;

  torch::Tensor weight_;  // packed: [panels, in, 64] fp32; else the source as given, contiguous
  WeightLayout layout_ = WeightLayout::kInOut;  // the source's layout (unpacked weight_ keeps it)
  int64_t in_ = 0, out_ = 0;
  bool packed_ = false;
};

}  // namespace troupe::model
