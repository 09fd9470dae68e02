#pragma once
// LayerNorm over the last dimension of [T, E] fp32 rows, for the forward
// pass (model/gpt2.cpp): y = (x - mean) / sqrt(var + eps) * w + b, var the
// biased variance, as torch.nn.LayerNorm.
//
// On the CPU each row's mean and variance are sums in double (eight
// independent partial sums, which -O3 vectorises), the normalisation in fp32
// with the mean's rounding carried (layer_norm.cpp): one output tensor and no
// other allocation. at::layer_norm
// made three tensors and cost 4.4 us a call on a [1, 768] row here (0.1 ms of
// a ~2.7 ms int8 batch-1 step: 25 calls; Zen 5, 2026-12-05). Each row is
// computed alone, the same way whatever the number of rows or threads, so a
// sequence's activations do not depend on the batch it is in; rows are
// spread over kernel_parallel_for (the kernel team inside a small pass).
// Elsewhere (another device, another dtype, non-contiguous x) it is
// at::layer_norm.
#include <torch/types.h>

namespace troupe::model {

torch::Tensor layer_norm_rows(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              double eps);

}  // namespace troupe::model
