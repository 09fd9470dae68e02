// layer_norm_rows (model/layer_norm.hpp): torch.nn.LayerNorm's function, each
// row alone whatever the batch, threads or kernel team.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cmath>
#include <vector>

#include "model/kernel_team.hpp"
#include "model/layer_norm.hpp"

namespace troupe::model {
namespace {

// The function in double, row by row: the reference both are held to.
torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, double eps) {
  const torch::Tensor xd = x.to(torch::kDouble);
  const torch::Tensor mean = xd.mean(-1, true);
  const torch::Tensor var = (xd - mean).pow(2).mean(-1, true);
  return (xd - mean) / (var + eps).sqrt() * w.to(torch::kDouble) + b.to(torch::kDouble);
}

double max_abs(const torch::Tensor& a) { return a.abs().max().item<double>(); }

TEST(LayerNormRows, IsTorchsLayerNormForEveryWidth) {
  at::manual_seed(3);
  for (int64_t E : {1, 3, 8, 13, 64, 768, 1023}) {
    SCOPED_TRACE("E=" + std::to_string(E));
    const torch::Tensor x = at::randn({5, E}) * 3 + 0.5, w = at::randn({E}), b = at::randn({E});
    const torch::Tensor got = layer_norm_rows(x, w, b, 1e-5);
    ASSERT_EQ(got.sizes(), x.sizes());
    ASSERT_EQ(got.scalar_type(), torch::kFloat32);
    // at::layer_norm folds the mean into an fp32 bias (x * scale + bias):
    // within a few of its ulps; the double reference, within fp32's rounding.
    const torch::Tensor want = at::layer_norm(x, {E}, w, b, 1e-5);
    EXPECT_LT(max_abs(got - want), 1e-4);
    EXPECT_LT(max_abs(got.to(torch::kDouble) - reference(x, w, b, 1e-5)), 1e-5);
  }
}

TEST(LayerNormRows, UsesTheGivenEpsilon) {
  // A constant row: var = 0, so the output is b + 0 whatever eps; a row of
  // tiny spread shows eps: with eps = 1 its normalised values shrink ~1e6-fold.
  const torch::Tensor x = at::tensor({1.0f, 1.0f + 1e-6f, 1.0f - 1e-6f, 1.0f}).view({1, 4});
  const torch::Tensor w = at::ones({4}), b = at::zeros({4});
  EXPECT_LT(max_abs(layer_norm_rows(x, w, b, 1.0)), 1e-5);
  EXPECT_GT(max_abs(layer_norm_rows(x, w, b, 1e-12)), 0.5);
  EXPECT_LT(max_abs(layer_norm_rows(x, w, b, 1e-12).to(torch::kDouble) - reference(x, w, b, 1e-12)), 1e-3);
}

TEST(LayerNormRows, AFarOffsetKeepsItsPrecision) {
  // Mean 1e4, spread 1: fp32 single-pass moments lose digits here; sums in
  // double keep the output within fp32's rounding of the inputs.
  at::manual_seed(4);
  const torch::Tensor x = at::randn({3, 768}) + 1e4, w = at::ones({768}), b = at::zeros({768});
  EXPECT_LT(max_abs(layer_norm_rows(x, w, b, 1e-5).to(torch::kDouble) - reference(x, w, b, 1e-5)), 2e-3);
}

TEST(LayerNormRows, ARowIsTheSameBitsAloneInABatchOnAnyThreads) {
  at::manual_seed(5);
  const int64_t E = 768;
  const torch::Tensor x = at::randn({300, E}), w = at::randn({E}), b = at::randn({E});
  const int saved = at::get_num_threads();
  std::vector<torch::Tensor> outs;
  for (int threads : {1, 2, 3}) {
    at::set_num_threads(threads);
    outs.push_back(layer_norm_rows(x, w, b, 1e-5));
    for (int64_t tokens : {1, 300}) {  // a pass on a kernel team and one on OpenMP
      const KernelTeamScope scope(tokens);
      outs.push_back(layer_norm_rows(x, w, b, 1e-5));
    }
  }
  at::set_num_threads(saved);
  for (const torch::Tensor& o : outs) EXPECT_TRUE(at::equal(o, outs.front()));
  for (int64_t r : {0, 7, 299}) {
    EXPECT_TRUE(
        at::equal(layer_norm_rows(x.narrow(0, r, 1).contiguous(), w, b, 1e-5), outs.front().narrow(0, r, 1)));
  }
}

TEST(LayerNormRows, OtherInputsGoToAtLayerNorm) {
  at::manual_seed(6);
  const torch::Tensor w = at::randn({16}), b = at::randn({16});
  const torch::Tensor strided = at::randn({16, 8}).t();  // [8, 16], not contiguous
  EXPECT_TRUE(at::equal(layer_norm_rows(strided, w, b, 1e-5), at::layer_norm(strided, {16}, w, b, 1e-5)));
  const torch::Tensor three = at::randn({2, 3, 16});
  EXPECT_TRUE(at::equal(layer_norm_rows(three, w, b, 1e-5), at::layer_norm(three, {16}, w, b, 1e-5)));
  const torch::Tensor dbl = at::randn({4, 16}, torch::kDouble);
  EXPECT_TRUE(at::equal(layer_norm_rows(dbl, w.to(torch::kDouble), b.to(torch::kDouble), 1e-5),
                        at::layer_norm(dbl, {16}, w.to(torch::kDouble), b.to(torch::kDouble), 1e-5)));
  EXPECT_EQ(layer_norm_rows(at::randn({0, 16}), w, b, 1e-5).size(0), 0);
}

}  // namespace
}  // namespace troupe::model
