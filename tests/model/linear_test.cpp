// Linear's packed AVX-512 kernel against a double-precision reference and
// at::addmm, over shapes that are not multiples of its tile sizes; the
// accumulate variant, the tied-embedding lookup, and the fallback path.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "model/linear.hpp"

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
  std::vector<Case> c = {{1, 1, 1},     {1, 768, 2304}, {2, 768, 768},   {3, 3072, 768}, {4, 768, 3072},
                         {5, 17, 65},   {6, 64, 64},    {7, 100, 129},   {8, 33, 47},    {13, 96, 200},
                         {16, 768, 770}, {64, 5, 1000}, {100, 300, 100}, {131, 77, 191}, {300, 64, 63}};
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> m(1, 300), kn(1, 100);
  for (int i = 0; i < 12; ++i) c.push_back({m(rng), kn(rng), kn(rng)});
  return c;
}

TEST(Linear, PacksFp32CpuWeightsWhenBuiltWithAvx512) {
  const Linear lin(at::randn({8, 8}), WeightLayout::kInOut);
#if defined(__AVX512F__)
  EXPECT_TRUE(lin.packed());
#else
  EXPECT_FALSE(lin.packed());
#endif
  EXPECT_FALSE(Linear(at::randn({8, 8}), WeightLayout::kInOut, /*pack=*/false).packed());
  EXPECT_FALSE(Linear(at::randn({8, 8}, torch::kDouble), WeightLayout::kInOut).packed());
  EXPECT_EQ(lin.in_features(), 8);
  EXPECT_EQ(lin.out_features(), 8);
}

TEST(Linear, ForwardMatchesReferenceOnOddShapesInBothLayouts) {
  at::manual_seed(1);
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const Linear in_out(w, WeightLayout::kInOut);
    const Linear out_in(w.t().contiguous(), WeightLayout::kOutIn);
    const torch::Tensor y = in_out.forward(x, b);
    ASSERT_EQ(y.sizes(), (c10::IntArrayRef{c.m, c.n}));
    EXPECT_LT(rel_error(y, x, w, b), kRelTol);
    EXPECT_LT(rel_error(out_in.forward(x, b), x, w, b), kRelTol);
    EXPECT_LT(rel_error(in_out.forward(x), x, w, {}), kRelTol);
    // The BLAS call the model made before, held to the same bound.
    EXPECT_LT(rel_error(at::addmm(b, x, w), x, w, b), kRelTol);
  }
}

TEST(Linear, LmHeadShapeMatchesAddmm) {
  at::manual_seed(2);
  const torch::Tensor wte = at::randn({50257, 96}) * 0.1;
  const Linear head(wte, WeightLayout::kOutIn);
  for (int64_t m : {1, 3, 9}) {
    const torch::Tensor x = at::randn({m, 96});
    const torch::Tensor y = head.forward(x);
    EXPECT_LT(rel_error(y, x, wte.t(), {}), kRelTol);
    EXPECT_LT((y - at::matmul(x, wte.t())).abs().max().item<float>(), 1e-4f);
  }
}

TEST(Linear, ForwardAddAccumulatesIntoOut) {
  at::manual_seed(3);
  for (const Case& c : cases()) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
    const torch::Tensor w = at::randn({c.k, c.n}), b = at::randn({c.n}), x = at::randn({c.m, c.k});
    const torch::Tensor base = at::randn({c.m, c.n}) * 3.0;
    const Linear lin(w, WeightLayout::kInOut);
    torch::Tensor out = base.clone();
    lin.forward_add_(out, x, b);
    EXPECT_LT(rel_error(out, x, w, b, base), kRelTol);
    out = base.clone();
    lin.forward_add_(out, x);
    EXPECT_LT(rel_error(out, x, w, {}, base), kRelTol);
  }
}

TEST(Linear, NonContiguousInputsAndOutputsAreHandled) {
  at::manual_seed(4);
  const torch::Tensor w = at::randn({70, 90}), b = at::randn({90});
  const Linear lin(w, WeightLayout::kInOut);
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

TEST(Linear, ResultDoesNotDependOnThreadCount) {
  at::manual_seed(5);
  const torch::Tensor w = at::randn({300, 1000}), b = at::randn({1000}), x = at::randn({37, 300});
  const Linear lin(w, WeightLayout::kInOut);
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  const torch::Tensor one = lin.forward(x, b);
  at::set_num_threads(3);
  const torch::Tensor three = lin.forward(x, b);
  at::set_num_threads(saved);
  EXPECT_TRUE(at::equal(one, three));
}

TEST(Linear, EmptyBatchGivesEmptyResult) {
  const Linear lin(at::randn({16, 24}), WeightLayout::kInOut);
  const torch::Tensor y = lin.forward(at::empty({0, 16}), at::randn({24}));
  EXPECT_EQ(y.sizes(), (c10::IntArrayRef{0, 24}));
  torch::Tensor out = at::empty({0, 24});
  lin.forward_add_(out, at::empty({0, 16}));
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

TEST(Linear, RejectsCallerMistakes) {
  const Linear lin(at::randn({16, 24}), WeightLayout::kInOut);
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

TEST(Linear, EmbeddingReadsRowsOfTheOutInMatrix) {
  at::manual_seed(8);
  const torch::Tensor wte = at::randn({131, 40});
  const torch::Tensor ids = torch::tensor(std::vector<int64_t>{0, 63, 64, 65, 130, 7, 7});
  for (bool pack : {true, false}) {
    SCOPED_TRACE(pack ? "packed" : "unpacked");
    EXPECT_TRUE(at::equal(Linear(wte, WeightLayout::kOutIn, pack).embedding(ids), wte.index_select(0, ids)));
    EXPECT_TRUE(at::equal(Linear(wte.t().contiguous(), WeightLayout::kInOut, pack).embedding(ids),
                          wte.index_select(0, ids)));
  }
  const Linear head(wte, WeightLayout::kOutIn);
  EXPECT_THROW(head.embedding(torch::tensor(std::vector<int64_t>{131})), std::exception);
  EXPECT_THROW(head.embedding(torch::tensor(std::vector<int64_t>{-1})), std::exception);
  EXPECT_THROW(head.embedding(at::zeros({2, 2}, torch::kLong)), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::model
