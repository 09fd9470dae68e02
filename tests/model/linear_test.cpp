// Linear in every kernel variant (AVX-512 and AVX2 packed kernels, the
// portable BLAS path) against a double-precision reference, over shapes that
// are not multiples of any tile size; the accumulate variant, the
// tied-embedding lookup, thread splits, and the fallback path. A variant this
// CPU cannot run is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "core/heap_pages.hpp"
#include "isa_params.hpp"
#include "model/linear.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

// fp32 sums of K products in another order than the reference: the error of
// each output is bounded by a small multiple of eps * sum |terms| (Higham,
// "Accuracy and Stability of Numerical Algorithms", 3.1), 2e-5 leaves room
// for K up to a few thousand.
constexpr double kRelTol = 2e-5;

// Max over outputs of |y - (base + x @ w + b)| / (|base| + |x| @ |w| + |b|), in double.
double rel_error(const torch::Tensor& y, const torch::Tensor& x, const torch::Tensor& w_in_out,
                 const torch::Tensor& b, const torch::Tensor& base = {}) {
  const torch::Tensor xd = x.to(torch::kDouble), wd = w_in_out.to(torch::kDouble);
  torch::Tensor ref = at::mm(xd, wd), scale = at::mm(xd.abs(), wd.abs());
  if (b.defined()) {
    ref = ref + b.to(torch::kDouble);
    scale = scale + b.to(torch::kDouble).abs();
  }
  if (base.defined()) {
    ref = ref + base.to(torch::kDouble);
    scale = scale + base.to(torch::kDouble).abs();
  }
  if (y.numel() == 0) return 0.0;
  return ((y.to(torch::kDouble) - ref).abs() / (scale + 1e-30)).max().item<double>();
}

struct Case {
  int64_t m, k, n;
};

std::vector<Case> cases() {
  std::vector<Case> c = {{1, 1, 1},      {1, 768, 2304}, {2, 768, 768},   {3, 3072, 768}, {4, 768, 3072},
                         {5, 17, 65},    {6, 64, 64},    {7, 100, 129},   {8, 33, 47},    {13, 96, 200},
                         {16, 768, 770}, {64, 5, 1000},  {100, 300, 100}, {131, 77, 191}, {300, 64, 63},
                         {1, 1001, 40},  {2, 333, 50},   {1, 3, 17},      {97, 520, 33},  {200, 260, 24}};
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> m(1, 300), kn(1, 100);
  for (int i = 0; i < 12; ++i) c.push_back({m(rng), kn(rng), kn(rng)});
  return c;
}

class LinearVariant : public ::testing::TestWithParam<CpuIsa> {};

// Columns per packed panel of a variant's kernel.
int64_t panel_width(CpuIsa isa) { return static_cast<int>(isa) >= static_cast<int>(CpuIsa::kAvx512) ? 64 : 16; }
// Rows of K a variant's int8 or bfloat16 panels hold: K, or K padded to pairs.
int64_t panel_rows(CpuIsa isa, int64_t k) { return isa == CpuIsa::kAvx512Bf16 ? (k + 1) / 2 * 2 : k; }

// x as an int8 weight's kernel sees it: on avx512bf16 (vpdpwssd) each row
// quantized to int16 with the scale max |row| / 32767 as the kernel does it
// in fp32 (q = x * (32767 / max) to nearest, even on ties), returned as q *
// scale; elsewhere x itself.
torch::Tensor int8_kernel_input(const torch::Tensor& x, CpuIsa isa) {
  if (isa != CpuIsa::kAvx512Bf16) return x;
  const torch::Tensor largest = x.abs().amax(1, /*keepdim=*/true);
  const torch::Tensor inv = at::where(largest > 0, 32767.0f / largest, at::zeros_like(largest));
  const torch::Tensor q = (x * inv).round().clamp(-32767, 32767);
  return q.to(torch::kDouble) * (largest / 32767.0f).to(torch::kDouble);
}

TEST_P(LinearVariant, PacksFp32CpuWeightsForItsVariant) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const Linear lin(at::randn({8, 8}), WeightLayout::kInOut, isa);
  EXPECT_EQ(lin.packed(), isa != CpuIsa::kPortable);
  EXPECT_EQ(lin.isa(), isa);
  EXPECT_FALSE(Linear(at::randn({8, 8}, torch::kDouble), WeightLayout::kInOut, isa).packed());
  EXPECT_EQ(lin.in_features(), 8);
  EXPECT_EQ(lin.out_features(), 8);
}

TEST(Linear, DefaultsToTheProcessVariantAndPackFalseMeansBlas) {
  const Linear lin(at::randn({8, 8}), WeightLayout::kInOut);
  EXPECT_EQ(lin.isa(), kernel_isa());
  EXPECT_EQ(lin.packed(), kernel_isa() != CpuIsa::kPortable);
  const Linear blas(at::randn({8, 8}), WeightLayout::kInOut, /*pack=*/false);
  EXPECT_FALSE(blas.packed());
  EXPECT_EQ(blas.isa(), CpuIsa::kPortable);
}

TEST(Linear, RefusesAVariantThisCpuCannotRun) {
  const CpuIsa top = all_isas().back();
  if (best_isa() == top) GTEST_SKIP() << "this CPU runs every variant: nothing to refuse";
  try {
    Linear(at::randn({8, 8}), WeightLayout::kInOut, top);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(std::string("cannot run the ") + to_string(top) + " kernels"),
              std::string::npos)
        << e.what();
  }
}

TEST_P(LinearVariant, ForwardMatchesReferenceOnOddShapesInBothLayouts) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  at::manual_seed(1);
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const Linear in_out(w, WeightLayout::kInOut, isa);
    const Linear out_in(w.t().contiguous(), WeightLayout::kOutIn, isa);
    const torch::Tensor y = in_out.forward(x, b);
    ASSERT_EQ(y.sizes(), (c10::IntArrayRef{c.m, c.n}));
    EXPECT_LT(rel_error(y, x, w, b), kRelTol);
    EXPECT_LT(rel_error(out_in.forward(x, b), x, w, b), kRelTol);
    EXPECT_LT(rel_error(in_out.forward(x), x, w, {}), kRelTol);
  }
}

// GPT-2's tanh GELU of y, in double.
torch::Tensor gelu_tanh_reference(const torch::Tensor& y) {
  const torch::Tensor d = y.to(torch::kDouble);
  return 0.5 * d * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (d + 0.044715 * d * d * d)));
}

// Max of |got - want| / (2e-6 |want| + 6e-8 |y|): below 1 when each result
// is within a few ulp of GELU(y), or of y where GELU is far below y (in the
// negative tail at::gelu's 1 + tanh(u) cancels: the portable path is exact
// only to ~ulp(1) |y| / 4 there).
double gelu_error(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& y) {
  const torch::Tensor bound = 2e-6 * want.abs() + 6e-8 * y.to(torch::kDouble).abs() + 1e-38;
  return ((got.to(torch::kDouble) - want).abs() / bound).max().item<double>();
}

TEST_P(LinearVariant, GeluActivationIsGpt2sTanhGeluOfTheSameSums) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  at::manual_seed(3);
  // Odd shapes, and K over several of the kernels' chunks (the GELU belongs
  // after the last one only).
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const Linear lin(w, WeightLayout::kInOut, isa);
    const torch::Tensor y = lin.forward(x, b);
    const torch::Tensor g = lin.forward(x, b, Activation::kGeluTanh);
    ASSERT_EQ(g.sizes(), y.sizes());
    // The same pre-activation bits: only the GELU's rounding differs.
    EXPECT_LT(gelu_error(g, gelu_tanh_reference(y), y), 1.0);
    const torch::Tensor y0 = lin.forward(x);
    EXPECT_LT(gelu_error(lin.forward(x, {}, Activation::kGeluTanh), gelu_tanh_reference(y0), y0), 1.0);
  }
  // Chosen pre-activations (x = 0, so y = bias): the whole range, both tails,
  // zeros, tiny values, and a NaN, which stays NaN.
  const int64_t n = 203;
  torch::Tensor bias = at::linspace(-40.0, 40.0, n);
  bias[0] = 0.0f;
  bias[1] = -0.0f;
  bias[2] = 1e-20f;
  bias[3] = -1e-20f;
  bias[4] = 3.0e38f;
  bias[5] = -3.0e38f;
  bias[6] = std::numeric_limits<float>::quiet_NaN();
  const Linear lin(at::randn({7, n}), WeightLayout::kInOut, isa);
  const torch::Tensor g = lin.forward(at::zeros({3, 7}), bias, Activation::kGeluTanh);
  for (int64_t row = 0; row < 3; ++row) {
    const torch::Tensor got = g[row];
    EXPECT_TRUE(std::isnan(got[6].item<float>()));
    const torch::Tensor finite = at::arange(n) != 6;
    const torch::Tensor want = gelu_tanh_reference(bias).masked_select(finite);
    const torch::Tensor have = got.masked_select(finite);
    EXPECT_TRUE(torch::isfinite(have).all().item<bool>());
    EXPECT_LT(gelu_error(have, want, bias.masked_select(finite)), 1.0);
    EXPECT_EQ(have[4].item<float>(), 3.0e38f);  // x * 1 for a large x
    EXPECT_EQ(have[5].item<float>(), 0.0f);     // ~0 far in the negative tail
    EXPECT_EQ(have[0].item<float>(), 0.0f);
  }
}

TEST_P(LinearVariant, LmHeadShapeMatchesReference) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  at::manual_seed(2);
  const torch::Tensor wte = at::randn({50257, 96}) * 0.1;
  const Linear head(wte, WeightLayout::kOutIn, isa);
  for (int64_t m : {1, 3, 9, 64}) {
    const torch::Tensor x = at::randn({m, 96});
    const torch::Tensor y = head.forward(x);
    EXPECT_LT(rel_error(y, x, wte.t(), {}), kRelTol);
    EXPECT_LT((y - at::matmul(x, wte.t())).abs().max().item<float>(), 1e-4f);
  }
}

TEST_P(LinearVariant, ForwardAddAccumulatesIntoOut) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  at::manual_seed(3);
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const torch::Tensor base = at::randn({c.m, c.n}) * 3.0;
    const Linear lin(w, WeightLayout::kInOut, isa);
    torch::Tensor out = base.clone();
    lin.forward_add_(out, x, b);
    EXPECT_LT(rel_error(out, x, w, b, base), kRelTol);
    out = base.clone();
    lin.forward_add_(out, x);
    EXPECT_LT(rel_error(out, x, w, {}, base), kRelTol);
  }
}

TEST_P(LinearVariant, NonContiguousInputsAndOutputsAreHandled) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  at::manual_seed(4);
  const torch::Tensor w = at::randn({70, 90}), b = at::randn({90});
  const Linear lin(w, WeightLayout::kInOut, isa);
  const torch::Tensor x = at::randn({70, 11}).t();  // [11, 70], column-major
  ASSERT_FALSE(x.is_contiguous());
  const torch::Tensor y = lin.forward(x, b);
  EXPECT_TRUE(at::equal(y, lin.forward(x.contiguous(), b)));
  torch::Tensor wide = at::randn({11, 200});
  torch::Tensor out = wide.narrow(1, 50, 90);  // row stride 200
  const torch::Tensor before = wide.clone();
  lin.forward_add_(out, x, b);
  EXPECT_LT(rel_error(out, x, w, b, before.narrow(1, 50, 90)), kRelTol);
  EXPECT_TRUE(at::equal(wide.narrow(1, 0, 50), before.narrow(1, 0, 50)));  // nothing outside the view
  EXPECT_TRUE(at::equal(wide.narrow(1, 140, 60), before.narrow(1, 140, 60)));
}

// Threads take disjoint ranges of column panels; a split that loses or
// repeats a panel shows up as wrong columns at some thread count.
TEST_P(LinearVariant, ForwardIsRightUnderEveryThreadSplit) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  at::manual_seed(5);
  const torch::Tensor w = at::randn({300, 1000}), b = at::randn({1000}), x = at::randn({37, 300});
  const Linear lin(w, WeightLayout::kInOut, isa);
  const int saved = at::get_num_threads();
  for (int threads : {1, 2, 3, 7}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    at::set_num_threads(threads);
    ASSERT_EQ(at::get_num_threads(), threads);
    EXPECT_LT(rel_error(lin.forward(x, b), x, w, b), kRelTol);
  }
  at::set_num_threads(saved);
}

TEST_P(LinearVariant, EmptyBatchGivesEmptyResult) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const Linear lin(at::randn({16, 24}), WeightLayout::kInOut, isa);
  const torch::Tensor y = lin.forward(at::empty({0, 16}), at::randn({24}));
  EXPECT_EQ(y.sizes(), (c10::IntArrayRef{0, 24}));
  torch::Tensor out = at::empty({0, 24});
  lin.forward_add_(out, at::empty({0, 16}));
  EXPECT_EQ(out.sizes(), (c10::IntArrayRef{0, 24}));
}

TEST(Linear, UnpackedPathIsTheBlasCallOfBefore) {
  at::manual_seed(6);
  const torch::Tensor w = at::randn({48, 80}), b = at::randn({80});
  const Linear lin(w, WeightLayout::kInOut, /*pack=*/false);
  ASSERT_FALSE(lin.packed());
  const torch::Tensor x1 = at::randn({1, 48}), x5 = at::randn({5, 48});
  EXPECT_TRUE(at::equal(lin.forward(x1, b), at::addmv(b, w.t(), x1.select(0, 0)).unsqueeze(0)));
  EXPECT_TRUE(at::equal(lin.forward(x5, b), at::addmm(b, x5, w)));
  torch::Tensor out = at::randn({5, 80});
  torch::Tensor expect = out.clone().addmm_(x5, w).add_(b);
  lin.forward_add_(out, x5, b);
  EXPECT_TRUE(at::equal(out, expect));
  const Linear head(w.t().contiguous(), WeightLayout::kOutIn, /*pack=*/false);
  EXPECT_TRUE(at::allclose(head.forward(x5), at::matmul(x5, w), 1e-5, 1e-5));
}

TEST(Linear, DoubleWeightsRunThroughTorch) {
  at::manual_seed(7);
  const torch::Tensor w = at::randn({20, 30}, torch::kDouble), b = at::randn({30}, torch::kDouble);
  const Linear lin(w, WeightLayout::kInOut);
  ASSERT_FALSE(lin.packed());
  const torch::Tensor x = at::randn({4, 20}, torch::kDouble);
  const torch::Tensor y = lin.forward(x, b);
  EXPECT_EQ(y.scalar_type(), torch::kDouble);
  EXPECT_TRUE(at::allclose(y, at::addmm(b, x, w), 1e-12, 1e-12));
}

TEST_P(LinearVariant, RejectsCallerMistakes) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  const Linear lin(at::randn({16, 24}), WeightLayout::kInOut, isa);
  torch::Tensor out = at::zeros({2, 24});
  EXPECT_THROW(lin.forward(at::randn({2, 15})), std::invalid_argument);
  EXPECT_THROW(lin.forward(at::randn({16})), std::invalid_argument);
  EXPECT_THROW(lin.forward(at::randn({2, 16}), at::randn({23})), std::invalid_argument);
  EXPECT_THROW(lin.forward_add_(out, at::randn({3, 16})), std::invalid_argument);
  EXPECT_THROW(Linear().forward(at::randn({2, 16})), std::invalid_argument);
  EXPECT_THROW(Linear(at::randn({4}), WeightLayout::kInOut), std::invalid_argument);
  if (lin.packed()) {
    EXPECT_THROW(lin.forward(at::randn({2, 16}, torch::kDouble)), std::invalid_argument);
    torch::Tensor out_d = at::zeros({2, 24}, torch::kDouble);
    EXPECT_THROW(lin.forward_add_(out_d, at::randn({2, 16})), std::invalid_argument);
  }
}

TEST_P(LinearVariant, EmbeddingReadsRowsOfTheOutInMatrix) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  at::manual_seed(8);
  const torch::Tensor wte = at::randn({131, 40});
  const torch::Tensor ids = torch::tensor(std::vector<int64_t>{0, 15, 16, 17, 63, 64, 65, 130, 7, 7});
  EXPECT_TRUE(at::equal(Linear(wte, WeightLayout::kOutIn, isa).embedding(ids), wte.index_select(0, ids)));
  EXPECT_TRUE(at::equal(Linear(wte.t().contiguous(), WeightLayout::kInOut, isa).embedding(ids),
                        wte.index_select(0, ids)));
  const Linear head(wte, WeightLayout::kOutIn, isa);
  EXPECT_THROW(head.embedding(torch::tensor(std::vector<int64_t>{131})), std::exception);
  EXPECT_THROW(head.embedding(torch::tensor(std::vector<int64_t>{-1})), std::exception);
  EXPECT_THROW(head.embedding(at::zeros({2, 2}, torch::kLong)), std::invalid_argument);
}

// bfloat16 weights: half the bytes, and the very same function as fp32
// weights equal to the rounded ones (widened in registers, the same FMAs in
// the same order): equal bits, for every shape, activation, accumulation and
// layout, and the embedding rows are the rounded ones. (The AVX-512 BF16
// variant computes another function: Bfloat16DotProducts... below.)
TEST_P(LinearVariant, Bfloat16WeightsComputeExactlyAsTheirRoundedFp32) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  // avx512bf16 with bf16_dot() rounds x too (Bfloat16DotProducts* below);
  // without it, it widens as avx512 does: tested here on every CPU.
  const ScopedBf16Dot widen(false);
  at::manual_seed(9);
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const torch::Tensor rounded = round_to_bfloat16(w);
    const Linear bf16(w, WeightLayout::kInOut, isa, WeightDtype::kBFloat16);
    const Linear ref(rounded, WeightLayout::kInOut, isa);
    EXPECT_EQ(bf16.dtype(), WeightDtype::kBFloat16);
    EXPECT_EQ(bf16.packed(), ref.packed());
    EXPECT_TRUE(at::equal(bf16.forward(x, b), ref.forward(x, b)));
    EXPECT_TRUE(at::equal(bf16.forward(x, b, Activation::kGeluTanh), ref.forward(x, b, Activation::kGeluTanh)));
    torch::Tensor acc = at::randn({c.m, c.n}), acc_ref = acc.clone();
    bf16.forward_add_(acc, x, b);
    ref.forward_add_(acc_ref, x, b);
    EXPECT_TRUE(at::equal(acc, acc_ref));
    const Linear out_in(w.t().contiguous(), WeightLayout::kOutIn, isa, WeightDtype::kBFloat16);
    const Linear out_in_ref(rounded.t().contiguous(), WeightLayout::kOutIn, isa);
    EXPECT_TRUE(at::equal(out_in.forward(x), out_in_ref.forward(x)));
    if (bf16.packed()) {
      const int64_t nr = panel_width(isa);
      EXPECT_EQ(bf16.weight_bytes(), (c.n + nr - 1) / nr * nr * c.k * 2) << "two bytes a weight";
    }
  }
  const torch::Tensor wte = at::randn({131, 40});
  const torch::Tensor ids = torch::tensor(std::vector<int64_t>{0, 15, 16, 63, 64, 130, 7});
  EXPECT_TRUE(at::equal(Linear(wte, WeightLayout::kOutIn, isa, WeightDtype::kBFloat16).embedding(ids),
                        round_to_bfloat16(wte).index_select(0, ids)));
}

// bfloat16 weights on vdpbf16ps (the avx512bf16 variant): bf16(x) @ bf16(W)
// with fp32 sums, so held to the fp32 kernels' tolerance against the double
// reference of the rounded x and W, in both layouts, with GELU and
// accumulation; each row of the result depends on its own row of x only
// (bit for bit, whatever rows run beside it); two bytes a weight over K
// padded to even; and not the widening kernel's function (x is rounded).
TEST(LinearBf16Dot, Bfloat16DotProductsRoundXAndDependOnlyOnTheirRow) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(CpuIsa::kAvx512Bf16);
  const ScopedBf16Dot on(true);  // the default on AMD only: bf16_dot()
  at::manual_seed(19);
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const torch::Tensor wr = round_to_bfloat16(w), xr = round_to_bfloat16(x);
    const Linear dot(w, WeightLayout::kInOut, CpuIsa::kAvx512Bf16, WeightDtype::kBFloat16);
    ASSERT_TRUE(dot.packed());
    const torch::Tensor y = dot.forward(x, b);
    EXPECT_LT(rel_error(y, xr, wr, b), kRelTol);
    EXPECT_TRUE(at::equal(dot.forward(xr, b), y)) << "x is rounded to bfloat16 first";
    EXPECT_LT(gelu_error(dot.forward(x, b, Activation::kGeluTanh), gelu_tanh_reference(y), y), 1.0);
    torch::Tensor acc = at::randn({c.m, c.n});
    const torch::Tensor base = acc.clone();
    dot.forward_add_(acc, x, b);
    EXPECT_LT(rel_error(acc, xr, wr, b, base), kRelTol);
    const Linear out_in(w.t().contiguous(), WeightLayout::kOutIn, CpuIsa::kAvx512Bf16, WeightDtype::kBFloat16);
    EXPECT_TRUE(at::equal(out_in.forward(x, b), y)) << "the same panels from either layout";
    for (int64_t i : {int64_t{0}, c.m / 2, c.m - 1})
      EXPECT_TRUE(at::equal(dot.forward(x.narrow(0, i, 1), b), y.narrow(0, i, 1))) << "row " << i << " alone";
    EXPECT_EQ(dot.weight_bytes(), (c.n + 63) / 64 * 64 * ((c.k + 1) / 2 * 2) * 2);
  }
  // Not the widening kernel: x = 1 + 2^-10 is not a bfloat16 (8 bits of
  // significand), so the two differ by W's column sums times 2^-10.
  const torch::Tensor w = at::randn({64, 80}), x = at::full({3, 64}, 1.0f + 1.0f / 1024);
  const torch::Tensor widened = Linear(w, WeightLayout::kInOut, CpuIsa::kAvx512, WeightDtype::kBFloat16).forward(x);
  const torch::Tensor dotted = Linear(w, WeightLayout::kInOut, CpuIsa::kAvx512Bf16, WeightDtype::kBFloat16).forward(x);
  EXPECT_LT(rel_error(dotted, at::ones_like(x), round_to_bfloat16(w), {}), kRelTol);
  EXPECT_GT((dotted - widened).abs().max().item<float>(), 1e-3f);
  const torch::Tensor wte = at::randn({131, 41});
  const torch::Tensor ids = torch::tensor(std::vector<int64_t>{0, 15, 16, 63, 64, 130, 7});
  EXPECT_TRUE(at::equal(Linear(wte, WeightLayout::kOutIn, CpuIsa::kAvx512Bf16, WeightDtype::kBFloat16).embedding(ids),
                        round_to_bfloat16(wte).index_select(0, ids)));
}

// Whether avx512bf16 runs bfloat16 weights on vdpbf16ps is chosen per CPU
// (on AMD, where it is fast), and a Linear keeps the arithmetic it was
// packed for whatever the choice is later; int8 stays on vpdpwssd.
TEST(LinearBf16Dot, TheChoiceIsTheCpusUnlessSetAndALinearKeepsItsOwn) {
  EXPECT_TRUE(choose_bf16_dot(nullptr, true));
  EXPECT_FALSE(choose_bf16_dot("", false));
  EXPECT_TRUE(choose_bf16_dot("1", false));
  EXPECT_FALSE(choose_bf16_dot("0", true));
  for (const char* bad : {"yes", "2", " 1"}) {
    try {
      choose_bf16_dot(bad, true);
      ADD_FAILURE() << bad << ": no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("TROUPE_BF16_DOT: '") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
  TROUPE_SKIP_UNLESS_CPU_RUNS(CpuIsa::kAvx512Bf16);
  at::manual_seed(29);
  const torch::Tensor w = at::randn({200, 130}), x = at::full({9, 200}, 1.0f + 1.0f / 1024);
  const torch::Tensor widened =
      Linear(w, WeightLayout::kInOut, CpuIsa::kAvx512, WeightDtype::kBFloat16).forward(x);
  torch::Tensor y_dot, y_wide;
  {
    const ScopedBf16Dot on(true);
    const Linear dot(w, WeightLayout::kInOut, CpuIsa::kAvx512Bf16, WeightDtype::kBFloat16);
    const ScopedBf16Dot off(false);  // packed already: it keeps vdpbf16ps
    y_dot = dot.forward(x);
    EXPECT_EQ(dot.weight_bytes(), 192 * 200 * 2);
    const Linear wide(w, WeightLayout::kInOut, CpuIsa::kAvx512Bf16, WeightDtype::kBFloat16);
    y_wide = wide.forward(x);
    EXPECT_TRUE(at::equal(y_wide, widened)) << "widened: the avx512 kernel's bits";
    EXPECT_TRUE(at::equal(wide.forward(x.narrow(0, 4, 1)), widened.narrow(0, 4, 1)))
        << "one row: the same bits";
  }
  EXPECT_GT((y_dot - y_wide).abs().max().item<float>(), 1e-3f)
      << "x = 1 + 2^-10 is rounded on vdpbf16ps only";
  const Linear now(w, WeightLayout::kInOut, CpuIsa::kAvx512Bf16, WeightDtype::kBFloat16);
  EXPECT_TRUE(at::equal(now.forward(x), bf16_dot() ? y_dot : y_wide));
}

// The avx512bf16 kernels keep x in 16 bits in a scratch buffer per thread,
// sized for the largest product the thread ran; release_kernel_scratch lets it
// go at the thread's next product (StepExecutor does, in the step after a
// large prefill), and the results are the same bits.
TEST(LinearBf16Dot, ScratchOfALargeProductGoesAtTheNextProductAfterRelease) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(CpuIsa::kAvx512Bf16);
  const ScopedBf16Dot on(true);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);  // one thread, so the one scratch
  at::manual_seed(23);
  for (WeightDtype dtype : {WeightDtype::kBFloat16, WeightDtype::kInt8}) {
    SCOPED_TRACE(to_string(dtype));
    const Linear lin(at::randn({1024, 256}), WeightLayout::kInOut, CpuIsa::kAvx512Bf16, dtype);
    const torch::Tensor one = at::randn({1, 1024});
    const torch::Tensor before = lin.forward(one);
    lin.forward(at::randn({4096, 1024}));  // 4096 rows x 512 pairs x 4 bytes: 8 MiB of scratch
    core::release_free_heap();
    const int64_t held = test::anon_kib();
    EXPECT_TRUE(at::equal(lin.forward(one), before));
    core::release_free_heap();
    if (test::kGlibcHeap) {
      EXPECT_GT(test::anon_kib(), held - (2 << 10)) << "a small product keeps the large scratch";
    }
    release_kernel_scratch();
    EXPECT_TRUE(at::equal(lin.forward(one), before));
    core::release_free_heap();
    if (test::kGlibcHeap) {
      EXPECT_LT(test::anon_kib(), held - (6 << 10)) << "released at the next product";
    }
  }
  at::set_num_threads(threads);
}

// int8 weights (symmetric, a scale per output channel): a quarter of the
// bytes, and fp32's function of the dequantized weights (q * scale) up to
// fp32 rounding — each output's sum of x * q is multiplied by its scale once
// per chunk of K instead of each weight — so every shape, activation,
// accumulation and layout is held to the fp32 kernels' tolerance against the
// double reference on quantize_int8_per_channel's values; the embedding rows
// are those values exactly.
TEST_P(LinearVariant, Int8WeightsComputeTheFp32FunctionOfTheirDequantizedValues) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  at::manual_seed(10);
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const torch::Tensor deq = quantize_int8_per_channel(w, WeightLayout::kInOut);
    const Linear q8(w, WeightLayout::kInOut, isa, WeightDtype::kInt8);
    EXPECT_EQ(q8.dtype(), WeightDtype::kInt8);
    EXPECT_EQ(q8.packed(), isa != CpuIsa::kPortable);
    const torch::Tensor y = q8.forward(x, b);
    const torch::Tensor xk = int8_kernel_input(x, isa);
    EXPECT_LT(rel_error(y, xk, deq, b), kRelTol);
    // GELU is applied to the same sums: within its slope (< 1.13) of them.
    const torch::Tensor g = q8.forward(x, b, Activation::kGeluTanh);
    const torch::Tensor scale =
        at::mm(xk.abs().to(torch::kDouble), deq.abs().to(torch::kDouble)) + b.abs().to(torch::kDouble) + 1e-30;
    const torch::Tensor g_ref =
        at::gelu(at::addmm(b.to(torch::kDouble), xk.to(torch::kDouble), deq.to(torch::kDouble)), "tanh");
    EXPECT_LT(((g.to(torch::kDouble) - g_ref).abs() / scale).max().item<double>(), 2 * kRelTol);
    torch::Tensor acc = at::randn({c.m, c.n});
    const torch::Tensor before = acc.clone();
    q8.forward_add_(acc, x, b);
    EXPECT_LT(rel_error(acc, xk, deq, b, before), kRelTol);
    // kOutIn: a channel is a row of the source, the same channels as w's columns.
    const torch::Tensor wt = w.t().contiguous();
    EXPECT_TRUE(at::equal(quantize_int8_per_channel(wt, WeightLayout::kOutIn), deq.t()));
    const Linear out_in(wt, WeightLayout::kOutIn, isa, WeightDtype::kInt8);
    EXPECT_LT(rel_error(out_in.forward(x), xk, deq, {}), kRelTol);
    // avx512 widens a chunk once for two row tiles or more, in registers for
    // one: a row's bits are its own either way.
    if (isa == CpuIsa::kAvx512) {
      for (int64_t i : {int64_t{0}, c.m / 2, c.m - 1})
        EXPECT_TRUE(at::equal(q8.forward(x.narrow(0, i, 1), b), y.narrow(0, i, 1)))
            << "row " << i << " alone";
    }
    if (q8.packed()) {
      const int64_t nr = panel_width(isa), padded = (c.n + nr - 1) / nr * nr;
      EXPECT_EQ(q8.weight_bytes(), padded * panel_rows(isa, c.k) + padded * 4)
          << "one byte a weight, four a column's scale";
    }
  }
  // Quantization is not free: the dequantized weights differ from the source.
  const torch::Tensor w = at::randn({300, 70}), x = at::randn({5, 300});
  EXPECT_GT((Linear(w, WeightLayout::kInOut, isa, WeightDtype::kInt8).forward(x) -
             Linear(w, WeightLayout::kInOut, isa).forward(x))
                .abs()
                .max()
                .item<float>(),
            1e-3f);
  const torch::Tensor wte = at::randn({131, 40});
  const torch::Tensor ids = torch::tensor(std::vector<int64_t>{0, 15, 16, 63, 64, 130, 7});
  EXPECT_TRUE(at::equal(Linear(wte, WeightLayout::kOutIn, isa, WeightDtype::kInt8).embedding(ids),
                        quantize_int8_per_channel(wte, WeightLayout::kOutIn).index_select(0, ids)));
}

// int8 in groups of 32 inputs (llama.cpp Q8_0's blocks): each weight is
// dequantized in registers before the fp32 kernel's FMAs, so the result is
// the fp32 Linear's on the dequantized weights bit for bit, in every shape,
// activation, accumulation and layout; the embedding rows are those values.
// (avx512bf16 sums int16 x times the int8 weights: Int8OnVnni... below.)
TEST_P(LinearVariant, Int8GroupsOf32ComputeExactlyAsTheirDequantizedFp32) {
  const CpuIsa isa = GetParam();
  TROUPE_SKIP_UNLESS_CPU_RUNS(isa);
  if (isa == CpuIsa::kAvx512Bf16) GTEST_SKIP() << "avx512bf16 quantizes x to int16: see Int8OnVnni*";
  at::manual_seed(11);
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const torch::Tensor deq = quantize_int8_groups_of_32(w, WeightLayout::kInOut);
    const Linear g32(w, WeightLayout::kInOut, isa, WeightDtype::kInt8G32);
    const Linear ref(deq, WeightLayout::kInOut, isa);
    EXPECT_EQ(g32.dtype(), WeightDtype::kInt8G32);
    EXPECT_EQ(g32.packed(), ref.packed());
    EXPECT_TRUE(at::equal(g32.forward(x, b), ref.forward(x, b)));
    EXPECT_TRUE(at::equal(g32.forward(x, b, Activation::kGeluTanh), ref.forward(x, b, Activation::kGeluTanh)));
    torch::Tensor acc = at::randn({c.m, c.n}), acc_ref = acc.clone();
    g32.forward_add_(acc, x, b);
    ref.forward_add_(acc_ref, x, b);
    EXPECT_TRUE(at::equal(acc, acc_ref));
    const torch::Tensor wt = w.t().contiguous();
    EXPECT_TRUE(at::equal(quantize_int8_groups_of_32(wt, WeightLayout::kOutIn), deq.t()));
    const Linear out_in(wt, WeightLayout::kOutIn, isa, WeightDtype::kInt8G32);
    EXPECT_TRUE(at::equal(out_in.forward(x), Linear(deq.t().contiguous(), WeightLayout::kOutIn, isa).forward(x)));
    if (g32.packed()) {
      const int64_t nr = panel_width(isa), padded = (c.n + nr - 1) / nr * nr;
      EXPECT_EQ(g32.weight_bytes(), padded * c.k + padded * ((c.k + 31) / 32) * 4)
          << "one byte a weight, four a group's scale";
    }
  }
  const torch::Tensor wte = at::randn({131, 70});
  const torch::Tensor ids = torch::tensor(std::vector<int64_t>{0, 15, 16, 63, 64, 130, 7});
  EXPECT_TRUE(at::equal(Linear(wte, WeightLayout::kOutIn, isa, WeightDtype::kInt8G32).embedding(ids),
                        quantize_int8_groups_of_32(wte, WeightLayout::kOutIn).index_select(0, ids)));
}

// int8 weights on vpdpwssd (avx512bf16): both layouts of scales are the
// function of x quantized to int16 per row (int8_kernel_input) and the
// dequantized weights, to the fp32 kernels' tolerance, with GELU and
// accumulation; every row depends on its own row of x only (bit for bit);
// one byte a weight over K padded to pairs; and not the widening kernel's
// function (avx512, which keeps x in fp32).
TEST(LinearVnni, Int8OnVnniQuantizesXToInt16AndDependsOnlyOnTheRow) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(CpuIsa::kAvx512Bf16);
  const CpuIsa isa = CpuIsa::kAvx512Bf16;
  at::manual_seed(12);
  for (WeightDtype dtype : {WeightDtype::kInt8, WeightDtype::kInt8G32}) {
    SCOPED_TRACE(to_string(dtype));
    for (const Case& c : cases()) {
      SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
      const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
      const torch::Tensor deq = dtype == WeightDtype::kInt8 ? quantize_int8_per_channel(w, WeightLayout::kInOut)
                                                            : quantize_int8_groups_of_32(w, WeightLayout::kInOut);
      const torch::Tensor xk = int8_kernel_input(x, isa);
      const Linear q(w, WeightLayout::kInOut, isa, dtype);
      ASSERT_TRUE(q.packed());
      const torch::Tensor y = q.forward(x, b);
      EXPECT_LT(rel_error(y, xk, deq, b), kRelTol);
      EXPECT_LT(gelu_error(q.forward(x, b, Activation::kGeluTanh), gelu_tanh_reference(y), y), 1.0);
      torch::Tensor acc = at::randn({c.m, c.n});
      const torch::Tensor before = acc.clone();
      q.forward_add_(acc, x, b);
      EXPECT_LT(rel_error(acc, xk, deq, b, before), kRelTol);
      const Linear out_in(w.t().contiguous(), WeightLayout::kOutIn, isa, dtype);
      EXPECT_TRUE(at::equal(out_in.forward(x, b), y)) << "the same panels from either layout";
      for (int64_t i : {int64_t{0}, c.m / 2, c.m - 1})
        EXPECT_TRUE(at::equal(q.forward(x.narrow(0, i, 1), b), y.narrow(0, i, 1))) << "row " << i << " alone";
      const int64_t padded = (c.n + 63) / 64 * 64, scales = dtype == WeightDtype::kInt8 ? 1 : (c.k + 31) / 32;
      EXPECT_EQ(q.weight_bytes(), padded * panel_rows(isa, c.k) + padded * scales * 4);
    }
    // x = 1 + 2^-14 in every place but one 1000: the int16 step (1000 / 32767)
    // swallows the 2^-14, the widening kernel keeps it.
    torch::Tensor x = at::full({2, 64}, 1.0f + 1.0f / 16384);
    x[0][5] = 1000.0f;
    x[1][7] = 1000.0f;
    const torch::Tensor w = at::randn({64, 80});
    const torch::Tensor vnni = Linear(w, WeightLayout::kInOut, isa, dtype).forward(x);
    const torch::Tensor widened = Linear(w, WeightLayout::kInOut, CpuIsa::kAvx512, dtype).forward(x);
    EXPECT_FALSE(at::equal(vnni, widened));
    const torch::Tensor wte = at::randn({131, 71});
    const torch::Tensor ids = torch::tensor(std::vector<int64_t>{0, 15, 16, 63, 64, 130, 7});
    const torch::Tensor deq_wte = dtype == WeightDtype::kInt8 ? quantize_int8_per_channel(wte, WeightLayout::kOutIn)
                                                              : quantize_int8_groups_of_32(wte, WeightLayout::kOutIn);
    EXPECT_TRUE(at::equal(Linear(wte, WeightLayout::kOutIn, isa, dtype).embedding(ids), deq_wte.index_select(0, ids)));
  }
}

// Scales of 1 and 2 (max |W| of 127 and 254) make every division exact, so
// the rounding (to nearest, ties to even) and the clamp show plainly.
TEST(Linear, QuantizesInt8PerOutputChannelToNearestEven) {
  // [in = 4, out = 3]: column 0 has scale 1, column 1 scale 2, column 2 is all zeros.
  const torch::Tensor w = torch::tensor(std::vector<float>{127, 254, 0,  //
                                                           2.5f, -5, 0,  //
                                                           -3.5f, 3, 0,  //
                                                           0.4f, -254, 0})
                              .view({4, 3});
  const torch::Tensor want = torch::tensor(std::vector<float>{127, 254, 0,  //
                                                              2, -4, 0,     //
                                                              -4, 4, 0,     //
                                                              0, -254, 0})
                                 .view({4, 3});
  EXPECT_TRUE(at::equal(quantize_int8_per_channel(w, WeightLayout::kInOut), want));
  EXPECT_TRUE(at::equal(quantize_int8_per_channel(w.t().contiguous(), WeightLayout::kOutIn), want.t()));
  // Per channel, not per tensor: a column of small values keeps its resolution.
  const torch::Tensor mixed = torch::tensor(std::vector<float>{1000, 0.01f, -1000, -0.02f}).view({2, 2});
  const torch::Tensor d = quantize_int8_per_channel(mixed, WeightLayout::kInOut);
  EXPECT_NEAR(d[0][1].item<float>(), 0.01f, 0.02f / 127);  // within a step of 0.02 / 127 (per tensor: 7.9)
  EXPECT_NEAR(d[1][1].item<float>(), -0.02f, 1e-7f);
  for (CpuIsa isa : all_isas()) {
    if (!cpu_supports(isa)) continue;
    SCOPED_TRACE(to_string(isa));
    // The scales land on the right columns: x = one-hot rows read W's rows back.
    const Linear q8(w, WeightLayout::kInOut, isa, WeightDtype::kInt8);
    EXPECT_TRUE(at::equal(q8.forward(at::eye(4)), want));
  }
  // Groups of 32 inputs: one column of 70 = 32 + 32 + 6 with maxima 127, 254
  // and 127 * 4; every group gets its own scale (1, 2, 4).
  torch::Tensor col = at::zeros({70, 1});
  col[0][0] = 127.0f;
  col[1][0] = 2.5f;    // scale 1: ties to even, 2
  col[32][0] = -254.0f;
  col[33][0] = 3.0f;   // scale 2: 1.5 -> 2, so 4
  col[64][0] = 508.0f;
  col[65][0] = 6.0f;   // scale 4: 1.5 -> 2, so 8
  col[66][0] = 2.0f;   // 0.5 -> 0
  torch::Tensor col_want = col.clone();
  col_want[1][0] = 2.0f;
  col_want[33][0] = 4.0f;
  col_want[65][0] = 8.0f;
  col_want[66][0] = 0.0f;
  EXPECT_TRUE(at::equal(quantize_int8_groups_of_32(col, WeightLayout::kInOut), col_want));
  EXPECT_TRUE(at::equal(quantize_int8_groups_of_32(col.t().contiguous(), WeightLayout::kOutIn), col_want.t()));
}

// A 16-bit file's matrix (bfloat16 or half) makes the bfloat16 or int8
// Linear that its values widened to fp32 make, on every variant, in either
// layout; it makes no float32 Linear.
TEST(Linear, SixteenBitSourceMakesTheSameLinearAsItsFp32Values) {
  at::manual_seed(31);
  const torch::Tensor w = at::randn({70, 150}), x = at::randn({5, 70});
  for (auto type : {torch::kBFloat16, torch::kHalf}) {
    const torch::Tensor src = w.to(type), wide = src.to(torch::kFloat32);
    for (CpuIsa isa : all_isas()) {
      if (!cpu_supports(isa)) continue;
      SCOPED_TRACE(std::string(to_string(isa)) + (type == torch::kHalf ? " half" : " bfloat16"));
      for (WeightDtype dtype : {WeightDtype::kBFloat16, WeightDtype::kInt8, WeightDtype::kInt8G32}) {
        const Linear from_fp32(wide, WeightLayout::kInOut, isa, dtype);
        const Linear from_src(src, WeightLayout::kInOut, isa, dtype);
        EXPECT_TRUE(at::equal(from_src.forward(x), from_fp32.forward(x))) << to_string(dtype);
        EXPECT_EQ(from_src.weight_bytes(), from_fp32.weight_bytes()) << to_string(dtype);
        const Linear out_in(src.t().contiguous(), WeightLayout::kOutIn, isa, dtype);
        EXPECT_TRUE(at::equal(out_in.forward(x), from_fp32.forward(x))) << to_string(dtype);
      }
      EXPECT_THROW(Linear(src, WeightLayout::kInOut, isa, WeightDtype::kFloat32), std::invalid_argument);
    }
  }
}

TEST(Linear, RoundsToNearestEvenAndParsesDtypeNames) {
  // 1 + 2^-8 lies halfway between bfloat16's 1 and 1 + 2^-7: ties go to even (1).
  const torch::Tensor t = torch::tensor(std::vector<float>{1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f});
  const torch::Tensor r = round_to_bfloat16(t);
  EXPECT_EQ(r[0].item<float>(), 1.0f);
  EXPECT_EQ(r[1].item<float>(), 1.0f + 4.0f / 256);
  EXPECT_EQ(r[2].item<float>(), -2.5f);
  EXPECT_EQ(parse_weight_dtype("bfloat16"), WeightDtype::kBFloat16);
  EXPECT_EQ(parse_weight_dtype("bf16"), WeightDtype::kBFloat16);
  EXPECT_EQ(parse_weight_dtype("float32"), WeightDtype::kFloat32);
  EXPECT_EQ(parse_weight_dtype("int8"), WeightDtype::kInt8);
  EXPECT_THROW(parse_weight_dtype("int4"), std::invalid_argument);
  EXPECT_STREQ(to_string(WeightDtype::kBFloat16), "bfloat16");
  EXPECT_STREQ(to_string(WeightDtype::kInt8), "int8");
  EXPECT_EQ(parse_weight_dtype("int8_g32"), WeightDtype::kInt8G32);
  EXPECT_STREQ(to_string(WeightDtype::kInt8G32), "int8_g32");
}

INSTANTIATE_TEST_SUITE_P(Isas, LinearVariant, ::testing::ValuesIn(all_isas()), test::isa_name);

}  // namespace
}  // namespace troupe::model
