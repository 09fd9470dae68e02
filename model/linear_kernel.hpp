#pragma once
// The packed GEMM kernels behind Linear, one per instruction set, each in its
// own translation unit compiled for that ISA (linear_avx512.cpp,
// linear_avx2.cpp). Internal to model/: only linear.cpp calls them, after
// checking the CPU runs the variant.
//
// Packed layout (every variant, with its own panel width nr): W [K, N] as
// ceil(N / nr) panels, panel p = W[:, p * nr, (p + 1) * nr) as [K, nr]
// row-major and contiguous, the last one zero-padded past column N.
#include <cstdint>

#include "model/cpu_features.hpp"

namespace troupe::model {

// Bumped by release_kernel_scratch (linear.hpp): a kernel that keeps scratch
// memory per thread lets it go at its next call once this changed. Defined in
// linear.cpp (not in an ISA's translation unit).
uint64_t kernel_scratch_epoch();

// Rows of K per scale of run_int8_g32's weights (linear.hpp's kInt8Group).
constexpr int64_t kPackedGroupRows = 32;

struct PackedGemmKernel {
  int64_t nr;  // columns per panel
  // C = (accumulate ? C : 0) + x @ W[:, panels p0..p1) + bias, for the
  // columns of panels [p0, p1) only (other columns of C are not touched),
  // then GPT-2's tanh GELU on each result when `gelu` (accumulate false).
  // x [M, K] contiguous fp32; w: the packed weight; bias [N] or nullptr;
  // C [M, N] with row stride ldc. Panels are independent, so callers may
  // split [0, P) among threads: any split gives the same bits.
  void (*run)(const float* x, int64_t M, int64_t K, int64_t N, const float* w, const float* bias, float* c,
              int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1);
  // The same with the weight packed as bfloat16 (each the upper 16 bits of
  // an fp32): widened to fp32 in registers (or once per chunk into a
  // buffer when several row tiles share it: the same values), so the FMAs,
  // their order and so the bits are run's on the widened weights; half the
  // bytes stream in.
  void (*run_bf16)(const float* x, int64_t M, int64_t K, int64_t N, const uint16_t* w, const float* bias,
                   float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1);
  // The same with the weight packed as int8 q and scale [N] (column n's):
  // each q widened to fp32 in registers, the fp32 sums of x * q over a chunk
  // of K multiplied by scale[n] in the epilogue, before C, bias and GELU
  // (C += scale * sum + bias, one fused multiply-add per chunk). So the
  // result is fp32 x @ (q * scale) up to the rounding of those multiplies;
  // a quarter of fp32's bytes stream in.
  void (*run_int8)(const float* x, int64_t M, int64_t K, int64_t N, const int8_t* w, const float* scale,
                   const float* bias, float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0,
                   int64_t p1);
  // The same with a scale per group of 32 rows of K (llama.cpp Q8_0's
  // blocks): group_scale [P, ceil(K / 32), nr], as the panels. Each q is
  // widened and multiplied by its group's scale in registers (one rounding:
  // exactly the fp32 value q * scale), then run's FMAs in run's order: the
  // bits of run on the dequantized weights.
  void (*run_int8_g32)(const float* x, int64_t M, int64_t K, int64_t N, const int8_t* w,
                       const float* group_scale, const float* bias, float* c, int64_t ldc, bool accumulate,
                       bool gelu, int64_t p0, int64_t p1);
  // run_bf16's (bf16_pairs), run_int8's and run_int8_g32's (int8_pairs)
  // panels hold pairs of K rows (avx512bf16: vdpbf16ps, vpdpwssd): panel p
  // is [ceil(K / 2)][nr][2], element (r, j, h) = W[2r + h][p * nr + j], zero
  // past K and past column N. And x is rounded first: to bfloat16 for
  // run_bf16 (bf16(x) @ W with fp32 sums), to int16 with a scale per row for
  // the int8 ones (exact int32 sums of x_q * q, scaled once per chunk or
  // group). False: [K, nr] like fp32's, widened in registers.
  bool bf16_pairs = false;
  bool int8_pairs = false;
};

// The variant's kernel; nullptr for CpuIsa::kPortable (Linear uses BLAS).
const PackedGemmKernel* packed_gemm_kernel(CpuIsa isa);

namespace avx512 {
extern const PackedGemmKernel kPackedGemm;
}
namespace avx2 {
extern const PackedGemmKernel kPackedGemm;
}
// AVX-512 with AVX512_BF16 and VNNI: avx512's fp32 kernel, and bfloat16 and
// int8 weights on pairs (defined in linear_avx512.cpp, the pair kernels in
// linear_avx512bf16.cpp); kPackedGemmWidenedBf16: the same with avx512's
// widening bfloat16 kernel, for CPUs where vdpbf16ps is slow (bf16_dot()).
namespace avx512bf16 {
extern const PackedGemmKernel kPackedGemm;
extern const PackedGemmKernel kPackedGemmWidenedBf16;
void run_bf16_pairs(const float* x, int64_t M, int64_t K, int64_t N, const uint16_t* w, const float* bias, float* c,
                    int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1);
void run_int8_pairs(const float* x, int64_t M, int64_t K, int64_t N, const int8_t* w, const float* scale,
                    const float* bias, float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1);
void run_int8_g32_pairs(const float* x, int64_t M, int64_t K, int64_t N, const int8_t* w, const float* group_scale,
                        const float* bias, float* c, int64_t ldc, bool accumulate, bool gelu, int64_t p0, int64_t p1);
}

}  // namespace troupe::model
