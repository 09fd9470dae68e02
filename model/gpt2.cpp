#include "model/gpt2.hpp"

#include <malloc.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "model/kernel_team.hpp"
#include "model/layer_norm.hpp"
#include "model/paged_attention.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/safetensors.hpp"

namespace troupe::model {
namespace {

[[noreturn]] void bad(const std::string& who, const std::string& what) {
  throw std::invalid_argument(who + ": " + what);
}

torch::Tensor to_device(const torch::Tensor& t, torch::Device device) {
  return t.to(device, torch::kFloat32).contiguous();
}

void expect_shape(const torch::Tensor& t, std::vector<int64_t> shape, const std::string& name) {
  if (!t.defined() || t.sizes() != c10::IntArrayRef(shape))
    bad("Gpt2", "weight " + name + " has the wrong shape for the config");
}

// CPU int64 copy of a 1-D index tensor.
torch::Tensor cpu_index(const torch::Tensor& t, int64_t n, const char* name) {
  if (!t.defined() || t.dim() != 1 || t.size(0) != n)
    bad("Gpt2::forward_step",
        std::string(name) + " must be a 1-D tensor of T = " + std::to_string(n) + " entries");
  if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
    bad("Gpt2::forward_step", std::string(name) + " must be an integer tensor");
  return t.to(torch::kCPU, torch::kLong).contiguous();
}

}  // namespace

Gpt2::Gpt2(const Gpt2Config& config, Gpt2Weights weights, torch::Device device, WeightDtype dtype)
    : config_(config), device_(device), dtype_(dtype) {
  config_.validate();
  const int64_t E = config_.n_embd, V = config_.vocab_size, P = config_.n_positions;
  expect_shape(weights.wte, {V, E}, "wte");
  expect_shape(weights.wpe, {P, E}, "wpe");
  expect_shape(weights.ln_f_weight, {E}, "ln_f.weight");
  expect_shape(weights.ln_f_bias, {E}, "ln_f.bias");
  if (weights.layers.size() != static_cast<size_t>(config_.n_layer))
    bad("Gpt2", "weights hold " + std::to_string(weights.layers.size()) + " layers, the config says " +
                    std::to_string(config_.n_layer));
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& w = weights.layers[i];
    const std::string p = "h." + std::to_string(i) + ".";
    expect_shape(w.ln_1_weight, {E}, p + "ln_1.weight");
    expect_shape(w.ln_1_bias, {E}, p + "ln_1.bias");
    expect_shape(w.attn_c_attn_weight, {E, 3 * E}, p + "attn.c_attn.weight");
    expect_shape(w.attn_c_attn_bias, {3 * E}, p + "attn.c_attn.bias");
    expect_shape(w.attn_c_proj_weight, {E, E}, p + "attn.c_proj.weight");
    expect_shape(w.attn_c_proj_bias, {E}, p + "attn.c_proj.bias");
    expect_shape(w.ln_2_weight, {E}, p + "ln_2.weight");
    expect_shape(w.ln_2_bias, {E}, p + "ln_2.bias");
    expect_shape(w.mlp_c_fc_weight, {E, 4 * E}, p + "mlp.c_fc.weight");
    expect_shape(w.mlp_c_fc_bias, {4 * E}, p + "mlp.c_fc.bias");
    expect_shape(w.mlp_c_proj_weight, {4 * E, E}, p + "mlp.c_proj.weight");
    expect_shape(w.mlp_c_proj_bias, {E}, p + "mlp.c_proj.bias");
  }
  // Each source is let go once copied: weights moved in are freed as the
  // copies are made, so the two sets never coexist whole.
  // The weight matrices in `dtype` (bfloat16: as llama.cpp's BF16 files
  // hold them, the norms' and biases' vectors stay fp32; int8: wte — so the
  // LM head and the embedding lookup, one per-vocabulary-row scale each — and
  // the four projections per block, per output channel (int8_g32: per group
  // of 32 inputs of each); wpe stays fp32, as the vectors do: 3 MB of which a
  // step reads only its positions' rows).
  // A 16-bit file's matrices (over the mapping) go to a bfloat16 or int8
  // model's Linears as they are, which pack or quantize them without a whole
  // fp32 copy; a float32 model widens them one matrix at a time.
  auto linear = [&](const torch::Tensor& w, WeightLayout layout) {
    const bool as_is = dtype != WeightDtype::kFloat32 && device.is_cpu();
    Linear packed(as_is ? w : to_device(w, device), layout, kernel_isa(), dtype);
    release_mapped_pages(w);  // a matrix still in its file (shared weights): its pages leave memory once read
    return packed;
  };
  head_ = linear(weights.wte, WeightLayout::kOutIn);
  weights.wte = torch::Tensor();
  malloc_trim(0);
  wpe_ = dtype == WeightDtype::kBFloat16 ? round_to_bfloat16(to_device(weights.wpe, device))
                                         : to_device(weights.wpe, device);
  ln_f_w_ = to_device(weights.ln_f_weight, device);
  ln_f_b_ = to_device(weights.ln_f_bias, device);
  for (LayerWeights& w : weights.layers) {
    layers_.push_back(Layer{to_device(w.ln_1_weight, device), to_device(w.ln_1_bias, device),
                            to_device(w.attn_c_attn_bias, device), to_device(w.attn_c_proj_bias, device),
                            to_device(w.ln_2_weight, device), to_device(w.ln_2_bias, device),
                            to_device(w.mlp_c_fc_bias, device), to_device(w.mlp_c_proj_bias, device),
                            linear(w.attn_c_attn_weight, WeightLayout::kInOut),
                            linear(w.attn_c_proj_weight, WeightLayout::kInOut),
                            linear(w.mlp_c_fc_weight, WeightLayout::kInOut),
                            linear(w.mlp_c_proj_weight, WeightLayout::kInOut)});
    w = {};
    malloc_trim(0);  // hand the freed source back (tune_malloc keeps freed memory): the copies are new memory
  }
}

void Gpt2::check_ids(const std::vector<int32_t>& ids, const char* who) const {
  for (int32_t id : ids)
    if (id < 0 || id >= config_.vocab_size)
      bad(who, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                   std::to_string(config_.vocab_size) + ")");
}

torch::Tensor Gpt2::embed(const torch::Tensor& ids, const torch::Tensor& positions) const {
  return head_.embedding(ids).add_(wpe_.index_select(0, positions));
}

torch::Tensor Gpt2::run_blocks(torch::Tensor x, const AttendFn& attend,
                               const torch::Tensor& keep_rows) const {
  const int64_t H = config_.n_head, D = config_.head_dim();
  const double eps = config_.layer_norm_epsilon;
  const KernelTeamScope team(x.size(0));  // a small pass: no libgomp region (kernel_team.hpp)
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& L = layers_[i];
    const int64_t T = x.size(0);
    const torch::Tensor h = layer_norm_rows(x, L.ln1_w, L.ln1_b, eps);
    const torch::Tensor qkv = L.attn.forward(h, L.attn_b);  // [T, 3E]
    const torch::Tensor qkv3 = qkv.view({T, 3, H, D});      // q, k, v: [T, H, D] views
    torch::Tensor a = attend(static_cast<int>(i), qkv3.select(1, 0), qkv3.select(1, 1), qkv3.select(1, 2));
    if (keep_rows.defined() && i + 1 == layers_.size()) {
      a = a.index_select(0, keep_rows);
      x = x.index_select(0, keep_rows);
    }
    L.attn_proj.forward_add_(x, a, L.attn_proj_b);
    const torch::Tensor f =
        L.fc.forward(layer_norm_rows(x, L.ln2_w, L.ln2_b, eps), L.fc_b, Activation::kGeluTanh);
    L.fc_proj.forward_add_(x, f, L.fc_proj_b);
  }
  return x;
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                               int64_t max_block_bytes) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), L = k.size(1), L0 = L - T;
  const int64_t rows = std::max<int64_t>(1, max_block_bytes / (H * L * static_cast<int64_t>(sizeof(float))));
  const torch::Tensor qh = q.transpose(0, 1), kt = k.transpose(1, 2);  // [H, T, D], [H, D, L]
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto block = [&](int64_t r0, int64_t n) {  // rows [r0, r0 + n): [H, n, D]
    torch::Tensor sc = at::matmul(qh.narrow(1, r0, n), kt).mul_(scale);
    if (L0 + r0 + 1 < L)  // row r0 + i must not see keys after L0 + r0 + i
      sc.masked_fill_(at::ones({n, L}, q.options().dtype(torch::kBool)).triu_(L0 + r0 + 1), neg_inf);
    return at::matmul(at::softmax(sc, -1), v);
  };
  if (T <= rows) return block(0, T).transpose(0, 1).reshape({T, H * D});
  torch::Tensor out = at::empty({T, H, D}, q.options());
  for (int64_t r0 = 0; r0 < T; r0 += rows) {
    const int64_t n = std::min(rows, T - r0);
    out.narrow(0, r0, n).copy_(block(r0, n).transpose(0, 1));
  }
  return out.view({T, H * D});
}

torch::Tensor Gpt2::lm_head(const torch::Tensor& x) const {
  const KernelTeamScope team(x.size(0));
  const torch::Tensor h = layer_norm_rows(x, ln_f_w_, ln_f_b_, config_.layer_norm_epsilon);
  return head_.forward(h);
}

torch::Tensor Gpt2::forward_full(const std::vector<int32_t>& ids) const {
  const char* who = "Gpt2::forward_full";
  const int64_t T = static_cast<int64_t>(ids.size());
  if (T == 0) bad(who, "no tokens");
  if (T > config_.n_positions)
    bad(who, std::to_string(T) + " tokens exceed n_positions = " + std::to_string(config_.n_positions));
  check_ids(ids, who);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  const torch::Tensor id_t =
      torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kLong).to(device_);
  torch::Tensor x = embed(id_t, at::arange(T, long_opts));
  const double scale = 1.0 / std::sqrt(static_cast<double>(config_.head_dim()));
  x = run_blocks(
      x,
      [&](int, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
        return causal_attention(q, k.transpose(0, 1), v.transpose(0, 1), scale);
      },
      torch::Tensor());
  return lm_head(x);
}

ContiguousKv Gpt2::make_contiguous_cache(int64_t capacity) const {
  if (capacity < 1 || capacity > config_.n_positions)
    bad("Gpt2::make_contiguous_cache",
        "capacity must be in [1, n_positions = " + std::to_string(config_.n_positions) + "], got " +
            std::to_string(capacity));
  ContiguousKv kv;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  for (int l = 0; l < config_.n_layer; ++l) {
    kv.k.push_back(torch::zeros({config_.n_head, capacity, config_.head_dim()}, opts));
    kv.v.push_back(torch::zeros({config_.n_head, capacity, config_.head_dim()}, opts));
  }
  kv.capacity = capacity;
  return kv;
}

torch::Tensor Gpt2::forward_contiguous(const std::vector<int32_t>& ids, ContiguousKv& cache,
                                       LogitRows rows) const {
  const char* who = "Gpt2::forward_contiguous";
  const int64_t T = static_cast<int64_t>(ids.size()), L0 = cache.length;
  if (T == 0) bad(who, "no tokens");
  if (cache.k.size() != static_cast<size_t>(config_.n_layer) || cache.v.size() != cache.k.size() || L0 < 0 ||
      L0 > cache.capacity)
    bad(who, "the cache was not made by make_contiguous_cache for this model");
  if (L0 + T > cache.capacity)
    bad(who, std::to_string(L0) + " cached + " + std::to_string(T) +
                 " new tokens exceed the cache capacity " + std::to_string(cache.capacity));
  if (L0 + T > config_.n_positions)
    bad(who, std::to_string(L0 + T) + " tokens exceed n_positions = " + std::to_string(config_.n_positions));
  check_ids(ids, who);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  const torch::Tensor id_t =
      torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kLong).to(device_);
  torch::Tensor x = embed(id_t, at::arange(L0, L0 + T, long_opts));
  const double scale = 1.0 / std::sqrt(static_cast<double>(config_.head_dim()));
  x = run_blocks(
      x,
      [&](int l, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
        torch::Tensor& kc = cache.k[static_cast<size_t>(l)];
        torch::Tensor& vc = cache.v[static_cast<size_t>(l)];
        kc.narrow(1, L0, T).copy_(k.transpose(0, 1));
        vc.narrow(1, L0, T).copy_(v.transpose(0, 1));
        return causal_attention(q, kc.narrow(1, 0, L0 + T), vc.narrow(1, 0, L0 + T), scale);
      },
      rows == LogitRows::kLast && T > 1 ? at::full({1}, T - 1, long_opts) : torch::Tensor());
  cache.length = L0 + T;
  return lm_head(x);
}

torch::Tensor Gpt2::forward_step(const FlatBatch& batch, PagedKvCache& cache,
                                 PagedAttention attention) const {
  return lm_head(forward_step_hidden(batch, cache, attention));
}

torch::Tensor Gpt2::forward_step_hidden(const FlatBatch& batch, PagedKvCache& cache,
                                        PagedAttention attention) const {
  const char* who = "Gpt2::forward_step";
  if (cache.n_layer() != config_.n_layer || cache.n_head() != config_.n_head ||
      cache.head_dim() != config_.head_dim())
    bad(who, "the KV cache was made for a different model shape");
  if (cache.device() != device_) bad(who, "the KV cache is on another device than the model");
  const bool kernel =
      attention == PagedAttention::kKernel || (attention == PagedAttention::kAuto && device_.is_cpu());
  if (kernel && !device_.is_cpu())
    bad(who, "PagedAttention::kKernel needs a CPU model; use kGather or kAuto");

  // Validation on CPU copies (a few small transfers on an accelerator): every
  // index is checked so a bad plan is an exception, not a wild write.
  const int64_t T = batch.token_ids.defined() ? batch.token_ids.numel() : 0;
  if (T == 0) bad(who, "the batch holds no tokens");
  const torch::Tensor ids = cpu_index(batch.token_ids, T, "token_ids");
  const torch::Tensor pos = cpu_index(batch.positions, T, "positions");
  const torch::Tensor slots = cpu_index(batch.slot_mapping, T, "slot_mapping");
  const int64_t S = static_cast<int64_t>(batch.context_lens.size());
  const auto& qs = batch.query_start;
  if (static_cast<int64_t>(qs.size()) != S + 1 || qs.front() != 0 || qs.back() != T)
    bad(who, "query_start must hold S + 1 = " + std::to_string(S + 1) +
                 " offsets from 0 to T = " + std::to_string(T));
  const torch::Tensor& bt_in = batch.block_tables;
  if (!bt_in.defined() || bt_in.dim() != 2 || bt_in.size(0) != S ||
      !at::isIntegralType(bt_in.scalar_type(), false))
    bad(who, "block_tables must be an integer tensor [S = " + std::to_string(S) + ", max_blocks]");
  const torch::Tensor bt = bt_in.to(torch::kCPU, torch::kInt).contiguous();
  const int32_t* btp = bt.data_ptr<int32_t>();
  const int64_t max_blocks = bt.size(1), bs = cache.block_size();
  const int64_t* idp = ids.data_ptr<int64_t>();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q0 = qs[s], q1 = qs[s + 1], ctx = batch.context_lens[s];
    if (q1 <= q0) bad(who, "sequence " + std::to_string(s) + " has no rows (query_start must increase)");
    if (ctx < q1 - q0)
      bad(who, "context_lens[" + std::to_string(s) + "] is shorter than its rows in this step");
    if (ctx > config_.n_positions)
      bad(who, "context_lens[" + std::to_string(s) + "] = " + std::to_string(ctx) +
                   " exceeds n_positions = " + std::to_string(config_.n_positions));
    const int64_t need = (ctx + bs - 1) / bs;
    if (need > max_blocks)
      bad(who, "sequence " + std::to_string(s) + " needs " + std::to_string(need) +
                   " blocks, its table holds " + std::to_string(max_blocks));
    const int32_t* table = btp + s * max_blocks;
    for (int64_t b = 0; b < need; ++b)
      if (table[b] < 0 || table[b] >= cache.num_blocks())
        bad(who, "block " + std::to_string(table[b]) + " of sequence " + std::to_string(s) +
                     " is outside the pool of " + std::to_string(cache.num_blocks()) + " blocks");
    for (int64_t i = q0; i < q1; ++i) {
      if (idp[i] < 0 || idp[i] >= config_.vocab_size)
        bad(who, "token id " + std::to_string(idp[i]) + " at row " + std::to_string(i) +
                     " is outside the vocabulary");
      if (pp[i] < 0 || pp[i] >= config_.n_positions)
        bad(who, "position " + std::to_string(pp[i]) + " at row " + std::to_string(i) +
                     " is beyond n_positions = " + std::to_string(config_.n_positions));
      if (pp[i] != ctx - (q1 - i))
        bad(who, "position " + std::to_string(pp[i]) + " at row " + std::to_string(i) +
                     " disagrees with context_lens (a sequence's rows must be its newest tokens, in order)");
      if (sp[i] < 0 || sp[i] >= cache.num_slots())
        bad(who, "slot " + std::to_string(sp[i]) + " at row " + std::to_string(i) +
                     " is beyond the pool of " + std::to_string(cache.num_slots()) + " slots");
      if (sp[i] != static_cast<int64_t>(table[pp[i] / bs]) * bs + pp[i] % bs)
        bad(who, "slot " + std::to_string(sp[i]) + " at row " + std::to_string(i) +
                     " disagrees with the block table for its position");
    }
  }
  for (int64_t r : batch.sample_rows)
    if (r < 0 || r >= T)
      bad(who, "sample row " + std::to_string(r) + " is outside [0, T = " + std::to_string(T) + ")");

  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
  const torch::Tensor slots_dev = slots.to(device_);
  torch::Tensor rows;
  if (!batch.sample_rows.empty())
    rows = torch::tensor(batch.sample_rows, torch::kLong).to(device_);
  else
    rows = at::empty({0}, long_opts);
  PagedAttentionInput in;
  in.query_start = qs;
  in.context_lens = batch.context_lens;
  in.block_tables = bt;
  const int64_t E = config_.n_embd;
  return run_blocks(
      embed(ids.to(device_), pos.to(device_)),
      [&](int l, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
        cache.write(l, slots_dev, k, v);
        in.q = q;
        in.k_pool = cache.k(l);
        in.v_pool = cache.v(l);
        return (kernel ? paged_attention_cpu(in) : paged_attention_gather(in)).view({T, E});
      },
      rows);
}

}  // namespace troupe::model
