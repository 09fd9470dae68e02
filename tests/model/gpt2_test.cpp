// Gpt2's three forward paths against each other and against an independent
// per-position reference in double precision, in every kernel variant the
// CPU runs (the others are skipped with the reason).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "isa_params.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"

namespace troupe::model {
namespace {

// GPT-2's init leaves biases at 0, LayerNorm at 1/0 and attention almost
// uniform; such weights hide a missing bias, a wrong scale or the wrong GELU.
// Widen them so every parameter matters and attention is peaked.
Gpt2Weights test_weights(const Gpt2Config& cfg, uint64_t seed) {
  Gpt2Weights w = Gpt2Weights::random(cfg, seed);
  at::manual_seed(static_cast<uint64_t>(seed) + 17);
  auto jitter = [](torch::Tensor& t, double s) { t = t + s * torch::randn(t.sizes()); };
  for (auto& l : w.layers) {
    jitter(l.ln_1_weight, 0.2);
    jitter(l.ln_1_bias, 0.2);
    jitter(l.ln_2_weight, 0.2);
    jitter(l.ln_2_bias, 0.2);
    l.attn_c_attn_weight = l.attn_c_attn_weight * 10.0;
    jitter(l.attn_c_attn_bias, 0.3);
    jitter(l.attn_c_proj_bias, 0.1);
    l.mlp_c_fc_weight = l.mlp_c_fc_weight * 8.0;
    jitter(l.mlp_c_fc_bias, 0.5);
    jitter(l.mlp_c_proj_bias, 0.1);
  }
  jitter(w.ln_f_weight, 0.2);
  jitter(w.ln_f_bias, 0.2);
  w.wte = w.wte * 5.0;
  w.wpe = w.wpe * 5.0;
  return w;
}

std::vector<int32_t> random_ids(int n, uint32_t seed, int vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = d(rng);
  return ids;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// Independent GPT-2: double precision, explicit LayerNorm and tanh GELU, HF's
// [in, out] weights as stored, attention one query position and head at a time.
torch::Tensor reference_logits(const Gpt2Config& cfg, const Gpt2Weights& w, const std::vector<int32_t>& ids) {
  auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const double eps = cfg.layer_norm_epsilon;
  auto layer_norm = [&](const torch::Tensor& x, const torch::Tensor& g, const torch::Tensor& b) {
    const torch::Tensor mean = x.mean(-1, true);
    const torch::Tensor var = (x - mean).pow(2).mean(-1, true);
    return (x - mean) / (var + eps).sqrt() * d(g) + d(b);
  };
  auto gelu = [](const torch::Tensor& x) {
    const double c = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + torch::tanh(c * (x + 0.044715 * x.pow(3))));
  };
  const int64_t T = static_cast<int64_t>(ids.size()), E = cfg.n_embd, H = cfg.n_head, D = cfg.head_dim();
  torch::Tensor x = torch::empty({T, E}, torch::kDouble);
  for (int64_t t = 0; t < T; ++t) x[t] = d(w.wte[ids[static_cast<size_t>(t)]]) + d(w.wpe[t]);
  for (const LayerWeights& l : w.layers) {
    const torch::Tensor qkv =
        layer_norm(x, l.ln_1_weight, l.ln_1_bias).matmul(d(l.attn_c_attn_weight)) + d(l.attn_c_attn_bias);
    torch::Tensor merged = torch::zeros({T, E}, torch::kDouble);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const torch::Tensor q = qkv[t].slice(0, h * D, (h + 1) * D);
        const torch::Tensor k = qkv.slice(0, 0, t + 1).slice(1, E + h * D, E + (h + 1) * D);
        const torch::Tensor v = qkv.slice(0, 0, t + 1).slice(1, 2 * E + h * D, 2 * E + (h + 1) * D);
        const torch::Tensor s = k.matmul(q) / std::sqrt(static_cast<double>(D));
        const torch::Tensor e = (s - s.max()).exp();
        merged[t].slice(0, h * D, (h + 1) * D) = (e / e.sum()).matmul(v);
      }
    }
    x = x + merged.matmul(d(l.attn_c_proj_weight)) + d(l.attn_c_proj_bias);
    const torch::Tensor f =
        gelu(layer_norm(x, l.ln_2_weight, l.ln_2_bias).matmul(d(l.mlp_c_fc_weight)) + d(l.mlp_c_fc_bias));
    x = x + f.matmul(d(l.mlp_c_proj_weight)) + d(l.mlp_c_proj_bias);
  }
  return layer_norm(x, w.ln_f_weight, w.ln_f_bias).matmul(d(w.wte).t());
}

class Gpt2Test : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { TROUPE_SKIP_UNLESS_CPU_RUNS(GetParam()); }
  // Set before the model packs its weights, kept for the kernels it calls.
  std::unique_ptr<ScopedKernelIsa> scope =
      cpu_supports(GetParam()) ? std::make_unique<ScopedKernelIsa>(GetParam()) : nullptr;
  Gpt2Config cfg = Gpt2Config::preset("tiny");
  Gpt2Weights weights = test_weights(cfg, 7);
  Gpt2 model{cfg, weights, torch::kCPU};
};

TEST_P(Gpt2Test, FullMatchesIndependentReference) {
  const auto ids = random_ids(23, 1, cfg.vocab_size);
  const torch::Tensor got = model.forward_full(ids);
  const torch::Tensor want = reference_logits(cfg, weights, ids);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_GT(want.abs().max().item<double>(), 1.0);  // logits large enough to show a defect
  EXPECT_LT(max_diff(got, want), 1e-4);
}

// The CLI, the head and worker nodes drop the loaded weights once their
// models are built (0.5 GB of GPT-2 124M): a packed model must not share
// their matrices, and none may need them afterwards.
TEST_P(Gpt2Test, WorksWithoutTheLoadedWeights) {
  const auto ids = random_ids(9, 3, cfg.vocab_size);
  const torch::Tensor before = model.forward_full(ids);
  if (GetParam() != CpuIsa::kPortable) {
    // The matrices (not the small vectors the model uses as they are) have no
    // holder but `weights`: releasing it frees them.
    EXPECT_EQ(weights.wte.storage().use_count(), 1);
    for (const LayerWeights& l : weights.layers) {
      for (const torch::Tensor* t :
           {&l.attn_c_attn_weight, &l.attn_c_proj_weight, &l.mlp_c_fc_weight, &l.mlp_c_proj_weight})
        EXPECT_EQ(t->storage().use_count(), 1);
    }
  }
  weights = Gpt2Weights{};
  EXPECT_TRUE(torch::equal(model.forward_full(ids), before));
}

// Weights moved in are let go as they are copied (CLI, profile): the same model.
TEST_P(Gpt2Test, MovedWeightsBuildTheSameModel) {
  const auto ids = random_ids(11, 4, cfg.vocab_size);
  Gpt2 moved(cfg, test_weights(cfg, 7), torch::kCPU);
  EXPECT_TRUE(torch::equal(moved.forward_full(ids), model.forward_full(ids)));
  Gpt2Weights w = test_weights(cfg, 7);
  Gpt2 from_w(cfg, std::move(w), torch::kCPU);
  EXPECT_TRUE(torch::equal(from_w.forward_full(ids), model.forward_full(ids)));
}

TEST_P(Gpt2Test, ReferenceSeesErfGeluAndWrongScale) {
  // The reference and weights are sensitive enough: GELU(erf) instead of
  // GELU(tanh), or the score scale off by a little, moves logits well past 1e-4.
  const auto ids = random_ids(16, 2, cfg.vocab_size);
  const torch::Tensor want = reference_logits(cfg, weights, ids);
  Gpt2Weights scaled = weights;
  for (auto& l : scaled.layers) {
    l.attn_c_attn_weight = l.attn_c_attn_weight.clone();
    l.attn_c_attn_bias = l.attn_c_attn_bias.clone();
    l.attn_c_attn_weight.slice(1, 0, cfg.n_embd).mul_(1.05);  // q only: score scale x1.05
    l.attn_c_attn_bias.slice(0, 0, cfg.n_embd).mul_(1.05);
  }
  EXPECT_GT(max_diff(Gpt2(cfg, scaled, torch::kCPU).forward_full(ids), want), 1e-3);
  const torch::Tensor x = torch::linspace(-3, 3, 101, torch::kDouble);
  EXPECT_GT((at::gelu(x, "tanh") - at::gelu(x)).abs().max().item<double>(), 1e-4);
}

TEST_P(Gpt2Test, ContiguousMatchesFullStepByStepAndGreedy) {
  std::vector<int32_t> seq = random_ids(9, 3, cfg.vocab_size);
  ContiguousKv kv = model.make_contiguous_cache(40);
  // Prefill in two chunks (the second sees a cache), then greedy decode.
  torch::Tensor logits = model.forward_contiguous({seq.begin(), seq.begin() + 5}, kv);
  EXPECT_LT(max_diff(logits, model.forward_full({seq.begin(), seq.begin() + 5})), 1e-4);
  logits = model.forward_contiguous({seq.begin() + 5, seq.end()}, kv);
  EXPECT_LT(max_diff(logits, model.forward_full(seq).slice(0, 5)), 1e-4);
  EXPECT_EQ(kv.length, 9);
  for (int step = 0; step < 20; ++step) {
    const torch::Tensor full = model.forward_full(seq);
    const auto greedy_full = static_cast<int32_t>(full[-1].argmax().item<int64_t>());
    const auto greedy_kv = static_cast<int32_t>(logits[-1].argmax().item<int64_t>());
    ASSERT_LT(max_diff(logits[-1], full[-1]), 1e-4) << "step " << step;
    ASSERT_EQ(greedy_kv, greedy_full) << "step " << step;
    seq.push_back(greedy_kv);
    logits = model.forward_contiguous({greedy_kv}, kv);
  }
  EXPECT_EQ(kv.length, 29);
}

TEST_P(Gpt2Test, ContiguousLastRowIsTheLastRowOfAll) {
  const std::vector<int32_t> seq = random_ids(12, 4, cfg.vocab_size);
  ContiguousKv all_kv = model.make_contiguous_cache(20), last_kv = model.make_contiguous_cache(20);
  const torch::Tensor all = model.forward_contiguous(seq, all_kv);
  const torch::Tensor last = model.forward_contiguous(seq, last_kv, LogitRows::kLast);
  ASSERT_EQ(last.sizes(), (std::vector<int64_t>{1, cfg.vocab_size}));
  EXPECT_LT(max_diff(last[0], all[-1]), 1e-5);
  EXPECT_EQ(last_kv.length, 12);
  // The caches agree, so the next step does too.
  const torch::Tensor next_all = model.forward_contiguous({7}, all_kv, LogitRows::kLast);
  const torch::Tensor next_last = model.forward_contiguous({7}, last_kv, LogitRows::kLast);
  EXPECT_LT(max_diff(next_all, next_last), 1e-5);
  std::vector<int32_t> longer = seq;
  longer.push_back(7);
  EXPECT_LT(max_diff(next_last[0], model.forward_full(longer)[-1]), 1e-4);
}

TEST_P(Gpt2Test, FullAndContiguousRejectBadInput) {
  EXPECT_THROW(model.forward_full({}), std::invalid_argument);
  EXPECT_THROW(model.forward_full(std::vector<int32_t>(cfg.n_positions + 1, 1)), std::invalid_argument);
  EXPECT_THROW(model.forward_full({1, cfg.vocab_size}), std::invalid_argument);
  EXPECT_THROW(model.forward_full({-1}), std::invalid_argument);
  EXPECT_THROW(model.make_contiguous_cache(0), std::invalid_argument);
  EXPECT_THROW(model.make_contiguous_cache(cfg.n_positions + 1), std::invalid_argument);
  ContiguousKv kv = model.make_contiguous_cache(4);
  model.forward_contiguous({1, 2, 3}, kv);
  EXPECT_THROW(model.forward_contiguous({4, 5}, kv), std::invalid_argument);
  EXPECT_EQ(kv.length, 3);
  model.forward_contiguous({4}, kv);
  EXPECT_EQ(kv.length, 4);
}

// `w` with wte and the four matrices of every block replaced by f(matrix,
// its layout): the values a model storing them in another dtype holds.
template <typename F>
Gpt2Weights with_matrices(Gpt2Weights w, F f) {
  w.wte = f(w.wte, WeightLayout::kOutIn);
  for (LayerWeights& l : w.layers) {
    l.attn_c_attn_weight = f(l.attn_c_attn_weight, WeightLayout::kInOut);
    l.attn_c_proj_weight = f(l.attn_c_proj_weight, WeightLayout::kInOut);
    l.mlp_c_fc_weight = f(l.mlp_c_fc_weight, WeightLayout::kInOut);
    l.mlp_c_proj_weight = f(l.mlp_c_proj_weight, WeightLayout::kInOut);
  }
  return w;
}

// bfloat16 weights: the model computes exactly what an fp32 model of the
// rounded matrices computes (wte, wpe and every projection rounded; the
// norms' and biases' vectors kept), in every way it runs, on the kernels that
// widen bfloat16 to fp32 (on avx512bf16 see the next test).
TEST(Gpt2Bfloat16, EqualsTheFp32ModelOfTheRoundedWeights) {
  const ScopedKernelIsa widening(std::min(kernel_isa(), CpuIsa::kAvx512));
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  const Gpt2Weights w = Gpt2Weights::random(cfg, 21);
  Gpt2Weights rounded = with_matrices(w, [](const torch::Tensor& t, WeightLayout) { return round_to_bfloat16(t); });
  rounded.wpe = round_to_bfloat16(w.wpe);
  const Gpt2 bf16(cfg, w, torch::kCPU, WeightDtype::kBFloat16);
  const Gpt2 ref(cfg, rounded, torch::kCPU);
  const Gpt2 fp32(cfg, w, torch::kCPU);
  EXPECT_EQ(bf16.dtype(), WeightDtype::kBFloat16);
  const std::vector<int32_t> ids = {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13};
  const torch::Tensor a = bf16.forward_full(ids), b = ref.forward_full(ids);
  EXPECT_TRUE(at::equal(a, b));
  auto cache = bf16.make_contiguous_cache(16);
  auto cache_ref = ref.make_contiguous_cache(16);
  EXPECT_TRUE(at::equal(bf16.forward_contiguous(ids, cache), ref.forward_contiguous(ids, cache_ref)));
  // ... and it is a different model from the fp32 one, close to it.
  const torch::Tensor c = fp32.forward_full(ids);
  EXPECT_FALSE(at::equal(a, c));
  EXPECT_LT((a - c).abs().max().item<float>(), 0.05f * c.abs().max().item<float>());
}

// On vdpbf16ps (avx512bf16) the matrices' inputs are rounded to bfloat16
// too: another model, close to the widening one. (Its tokens do not depend
// on the batch: StepExecutor.LowPrecisionGreedyTokens...)
TEST(Gpt2Bfloat16, DotProductKernelsRoundTheInputs) {
  TROUPE_SKIP_UNLESS_CPU_RUNS(CpuIsa::kAvx512Bf16);
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  const Gpt2Weights w = Gpt2Weights::random(cfg, 23);
  const std::vector<int32_t> ids = {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13};
  torch::Tensor widened;
  {
    const ScopedKernelIsa widen(CpuIsa::kAvx512);
    widened = Gpt2(cfg, w, torch::kCPU, WeightDtype::kBFloat16).forward_full(ids);
  }
  const ScopedKernelIsa dot(CpuIsa::kAvx512Bf16);
  const ScopedBf16Dot on(true);  // the default on AMD only
  const Gpt2 bf16(cfg, w, torch::kCPU, WeightDtype::kBFloat16);
  const torch::Tensor a = bf16.forward_full(ids);
  EXPECT_FALSE(at::equal(a, widened));
  EXPECT_LT((a - widened).abs().max().item<float>(), 0.05f * widened.abs().max().item<float>());
}

// int8 in groups of 32 (Q8_0's blocks): exactly the fp32 model of the
// dequantized matrices (wte and the four projections; wpe and the vectors as
// loaded), as bfloat16 is of its rounded ones.
TEST(Gpt2Int8Groups, EqualsTheFp32ModelOfTheDequantizedWeights) {
  const ScopedKernelIsa widening(std::min(kernel_isa(), CpuIsa::kAvx512));  // avx512bf16 quantizes x too
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  const Gpt2Weights w = Gpt2Weights::random(cfg, 22);
  const Gpt2Weights deq = with_matrices(w, quantize_int8_groups_of_32);
  const Gpt2 g32(cfg, w, torch::kCPU, WeightDtype::kInt8G32);
  const Gpt2 ref(cfg, deq, torch::kCPU);
  EXPECT_EQ(g32.dtype(), WeightDtype::kInt8G32);
  const std::vector<int32_t> ids = {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13};
  const torch::Tensor a = g32.forward_full(ids);
  EXPECT_TRUE(at::equal(a, ref.forward_full(ids)));
  auto cache = g32.make_contiguous_cache(16);
  auto cache_ref = ref.make_contiguous_cache(16);
  EXPECT_TRUE(at::equal(g32.forward_contiguous(ids, cache), ref.forward_contiguous(ids, cache_ref)));
  EXPECT_FALSE(at::equal(a, Gpt2(cfg, w, torch::kCPU).forward_full(ids)));
}

TEST(Gpt2Construct, RejectsWeightsOfAnotherShape) {
  const Gpt2Config cfg = Gpt2Config::preset("tiny");
  Gpt2Weights w = Gpt2Weights::random(cfg, 1);
  w.layers[1].mlp_c_fc_weight = w.layers[1].mlp_c_fc_weight.t();
  EXPECT_THROW(Gpt2(cfg, w, torch::kCPU), std::invalid_argument);
  w = Gpt2Weights::random(cfg, 1);
  w.layers.pop_back();
  EXPECT_THROW(Gpt2(cfg, w, torch::kCPU), std::invalid_argument);
}

// One sequence of the simulated scheduler: its tokens, its (shuffled) blocks,
// how many are in the cache, and forward_full's logits for every prefix.
struct SimSeq {
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  std::vector<int32_t> blocks;
  int64_t done = 0;
  torch::Tensor full;
};

// Chunked prefill mixed with decodes of other sequences over random block
// tables: every sampled row must equal forward_full on that row's prefix.
void run_scheduled(const Gpt2& model, int64_t block_size, PagedAttention attention, uint32_t seed, double tol = 1e-4) {
  const Gpt2Config& cfg = model.config();
  std::mt19937 rng(seed);
  const std::vector<int64_t> lengths{37, 5, 70, 19, 100, 1};
  std::vector<SimSeq> seqs;
  int64_t blocks_needed = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    SimSeq s;
    s.tokens = random_ids(static_cast<int>(lengths[i]), seed * 31 + static_cast<uint32_t>(i), cfg.vocab_size);
    s.prompt_len = std::max<int64_t>(1, lengths[i] * 2 / 3);
    s.full = model.forward_full(s.tokens);
    blocks_needed += (lengths[i] + block_size - 1) / block_size;
    seqs.push_back(std::move(s));
  }
  const int64_t num_blocks = blocks_needed + 7;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next_block = 0;
  for (auto& s : seqs)
    for (int64_t b = 0; b < (static_cast<int64_t>(s.tokens.size()) + block_size - 1) / block_size; ++b)
      s.blocks.push_back(ids[next_block++]);

  PagedKvCache cache(cfg, num_blocks, block_size);
  int sampled_rows = 0;
  for (int step = 0; step < 1000; ++step) {
    std::vector<int64_t> tok, pos, slot, qs{0}, ctx, rows;
    std::vector<size_t> members;
    for (size_t i = 0; i < seqs.size(); ++i) {
      SimSeq& s = seqs[i];
      const auto len = static_cast<int64_t>(s.tokens.size());
      if (s.done == len || static_cast<int>(i) > step || rng() % 10 < 3) continue;  // staggered, some skipped
      const int64_t n = s.done < s.prompt_len
                            ? std::min<int64_t>(s.prompt_len - s.done, 1 + static_cast<int64_t>(rng() % 13))
                            : 1;
      for (int64_t p = s.done; p < s.done + n; ++p) {
        tok.push_back(s.tokens[static_cast<size_t>(p)]);
        pos.push_back(p);
        slot.push_back(static_cast<int64_t>(s.blocks[static_cast<size_t>(p / block_size)]) * block_size +
                       p % block_size);
      }
      s.done += n;
      qs.push_back(static_cast<int64_t>(tok.size()));
      ctx.push_back(s.done);
      members.push_back(i);
    }
    if (members.empty()) {
      if (std::all_of(seqs.begin(), seqs.end(),
                      [](const SimSeq& s) { return s.done == (int64_t)s.tokens.size(); }))
        break;
      continue;
    }
    const auto S = static_cast<int64_t>(members.size());
    int64_t max_blocks = 0;
    for (int64_t c : ctx) max_blocks = std::max(max_blocks, (c + block_size - 1) / block_size);
    torch::Tensor tables = torch::zeros({S, max_blocks}, torch::kInt);
    for (int64_t j = 0; j < S; ++j)
      for (int64_t b = 0; b < (ctx[j] + block_size - 1) / block_size; ++b)
        tables[j][b] = seqs[members[j]].blocks[static_cast<size_t>(b)];
    const bool all_rows = step % 3 == 0;
    for (int64_t j = 0; j < S; ++j)
      for (int64_t r = all_rows ? qs[j] : qs[j + 1] - 1; r < qs[j + 1]; ++r) rows.push_back(r);

    FlatBatch batch;
    batch.token_ids = torch::tensor(tok, torch::kLong);
    batch.positions = torch::tensor(pos, torch::kLong);
    batch.slot_mapping = torch::tensor(slot, torch::kLong);
    batch.query_start = qs;
    batch.context_lens = ctx;
    batch.block_tables = tables;
    batch.sample_rows = rows;
    const torch::Tensor logits = model.forward_step(batch, cache, attention);
    ASSERT_EQ(logits.size(0), static_cast<int64_t>(rows.size()));
    ASSERT_EQ(logits.size(1), cfg.vocab_size);
    for (size_t k = 0; k < rows.size(); ++k) {
      const int64_t r = rows[k];
      const auto j = static_cast<size_t>(std::upper_bound(qs.begin(), qs.end(), r) - qs.begin() - 1);
      const torch::Tensor want = seqs[members[j]].full[pos[static_cast<size_t>(r)]];
      ASSERT_LT(max_diff(logits[static_cast<int64_t>(k)], want), tol)
          << "step " << step << " seq " << members[j] << " position " << pos[static_cast<size_t>(r)];
      ++sampled_rows;
    }
  }
  for (const auto& s : seqs) EXPECT_EQ(s.done, static_cast<int64_t>(s.tokens.size()));
  EXPECT_GT(sampled_rows, 100);
}

TEST_P(Gpt2Test, StepMatchesFullAcrossChunkedPrefillAndDecodes) {
  for (int64_t bs : {16, 8}) {
    for (auto attention : {PagedAttention::kKernel, PagedAttention::kGather, PagedAttention::kAuto}) {
      SCOPED_TRACE("block_size " + std::to_string(bs) + " attention " +
                   std::to_string(static_cast<int>(attention)));
      run_scheduled(model, bs, attention, static_cast<uint32_t>(bs) * 3 + static_cast<uint32_t>(attention));
    }
  }
}

// Two sequences: one prefilling rows 0..2 at positions 4..6, one decoding at 9.
FlatBatch valid_batch(int64_t bs) {
  FlatBatch b;
  b.token_ids = torch::tensor(std::vector<int64_t>{11, 12, 13, 14}, torch::kLong);
  b.positions = torch::tensor(std::vector<int64_t>{4, 5, 6, 9}, torch::kLong);
  b.block_tables = torch::tensor(std::vector<int32_t>{3, 0, 5, 1}, torch::kInt).view({2, 2});
  b.slot_mapping =
      torch::tensor(std::vector<int64_t>{3 * bs + 4, 3 * bs + 5, 3 * bs + 6, 5 * bs + 9 % bs}, torch::kLong);
  if (bs < 10) b.slot_mapping[3] = 1 * bs + 9 % bs;
  b.query_start = {0, 3, 4};
  b.context_lens = {7, 10};
  b.sample_rows = {2, 3};
  return b;
}

TEST_P(Gpt2Test, StepRejectsBadBatchesWithoutTouchingTheCache) {
  PagedKvCache cache(cfg, 8, 16);
  const torch::Tensor k0 = cache.k(0).clone(), v1 = cache.v(1).clone();
  auto expect_bad = [&](const FlatBatch& b, const char* what) {
    EXPECT_THROW(model.forward_step(b, cache), std::invalid_argument) << what;
    EXPECT_THROW(model.forward_step(b, cache, PagedAttention::kGather), std::invalid_argument) << what;
  };
  FlatBatch b = valid_batch(16);
  b.positions = b.positions.clone();
  b.positions[3] = cfg.n_positions + 2;
  expect_bad(b, "position beyond n_positions");
  b = valid_batch(16);
  b.context_lens[1] = cfg.n_positions + 1;
  expect_bad(b, "context beyond n_positions");
  b = valid_batch(16);
  b.slot_mapping = b.slot_mapping.clone();
  b.slot_mapping[0] = cache.num_slots() + 3;
  expect_bad(b, "slot beyond the pool");
  b = valid_batch(16);
  b.slot_mapping = b.slot_mapping.clone();
  b.slot_mapping[1] = 2;
  expect_bad(b, "slot disagreeing with the block table");
  b = valid_batch(16);
  b.positions = b.positions.slice(0, 0, 3);
  expect_bad(b, "positions shorter than the tokens");
  b = valid_batch(16);
  b.query_start = {0, 3, 5};
  expect_bad(b, "query_start not ending at T");
  b = valid_batch(16);
  b.context_lens = {7};
  expect_bad(b, "context_lens of another length");
  b = valid_batch(16);
  b.context_lens = {2, 10};
  expect_bad(b, "context shorter than the chunk");
  b = valid_batch(16);
  b.block_tables = b.block_tables.slice(0, 0, 1);
  expect_bad(b, "block_tables rows != S");
  b = valid_batch(16);
  b.block_tables = b.block_tables.clone();
  b.block_tables[1][0] = 8;
  expect_bad(b, "block beyond the pool");
  b = valid_batch(16);
  b.sample_rows = {4};
  expect_bad(b, "sample row beyond T");
  b = valid_batch(16);
  b.token_ids = torch::tensor(std::vector<int64_t>{11, 12, cfg.vocab_size, 14}, torch::kLong);
  expect_bad(b, "token beyond the vocabulary");
  b = valid_batch(16);
  b.token_ids = torch::empty({0}, torch::kLong);
  b.positions = b.slot_mapping = b.token_ids;
  b.query_start = {0};
  b.context_lens = {};
  b.block_tables = torch::zeros({0, 1}, torch::kInt);
  expect_bad(b, "empty batch");
  PagedKvCache other(Gpt2Config::preset("gpt2"), 1, 16);
  EXPECT_THROW(model.forward_step(valid_batch(16), other), std::invalid_argument);

  EXPECT_TRUE(torch::equal(cache.k(0), k0));
  EXPECT_TRUE(torch::equal(cache.v(1), v1));
  // The valid batch itself runs; earlier positions of each sequence are
  // whatever the (zeroed) cache holds, so only the shape is checked here.
  const torch::Tensor logits = model.forward_step(valid_batch(16), cache);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, cfg.vocab_size}));
  EXPECT_FALSE(torch::equal(cache.k(0), k0));
}

TEST_P(Gpt2Test, StepWithNoSampleRowsStillFillsTheCache) {
  PagedKvCache a(cfg, 8, 8), b(cfg, 8, 8);
  FlatBatch batch = valid_batch(8);
  const torch::Tensor with = model.forward_step(batch, a);
  batch.sample_rows.clear();
  const torch::Tensor without = model.forward_step(batch, b);
  EXPECT_EQ(with.size(0), 2);
  EXPECT_EQ(without.size(0), 0);
  for (int l = 0; l < cfg.n_layer; ++l) {
    EXPECT_TRUE(torch::equal(a.k(l), b.k(l)));
    EXPECT_TRUE(torch::equal(a.v(l), b.v(l)));
  }
}

// int8 weights: the fp32 model of the dequantized matrices (wte — so the LM
// head and the embedding lookup alike — and the four projections of every
// block, a scale per output channel; wpe and the vectors as loaded), in every
// variant: as close to the double reference on those values as the fp32
// model is to its own, clearly another model than the unquantized one, and
// its batched steps equal to forward_full row by row, whatever the batch.
TEST_P(Gpt2Test, Int8IsTheModelOfItsDequantizedWeights) {
  const Gpt2Weights deq = with_matrices(weights, quantize_int8_per_channel);
  const Gpt2 q8(cfg, weights, torch::kCPU, WeightDtype::kInt8);
  EXPECT_EQ(q8.dtype(), WeightDtype::kInt8);
  const auto ids = random_ids(23, 1, cfg.vocab_size);
  const torch::Tensor got = q8.forward_full(ids);
  // avx512bf16 quantizes each row of the matrices' inputs to int16 as well
  // (a step of 2^-15 of the row's largest value), so a difference of an ulp
  // upstream (another attention path) can move a value by a step: 10x the
  // tolerance, still 10x below the weights' own effect (checked next).
  const double tol = GetParam() == CpuIsa::kAvx512Bf16 ? 1e-3 : 1e-4;
  EXPECT_LT(max_diff(got, reference_logits(cfg, deq, ids)), tol);
  EXPECT_GT(max_diff(got, reference_logits(cfg, weights, ids)), 1e-2) << "int8 weights are another model";
  ContiguousKv kv = q8.make_contiguous_cache(static_cast<int64_t>(ids.size()));
  torch::Tensor last;
  for (int32_t id : ids) last = q8.forward_contiguous({id}, kv);
  EXPECT_LT(max_diff(last[-1], got[-1]), tol);
  run_scheduled(q8, 8, PagedAttention::kAuto, 5, tol);
}

INSTANTIATE_TEST_SUITE_P(Isas, Gpt2Test, ::testing::ValuesIn(all_isas()), test::isa_name);


// causal_attention in row blocks (as a long prompt gets) equals it whole, and
// both equal attention written out row by row, with and without keys cached
// before the rows (L > T).
TEST(CausalAttention, RowBlocksEqualTheWholeMatrixAndARowByRowReference) {
  torch::manual_seed(3);
  const int64_t H = 3, D = 8;
  for (const auto& [T, L] : std::vector<std::pair<int64_t, int64_t>>{{37, 37}, {20, 53}, {1, 9}}) {
    const torch::Tensor q = torch::randn({T, H, D}), k = torch::randn({H, L, D}), v = torch::randn({H, L, D});
    const double scale = 0.35;
    const torch::Tensor whole = causal_attention(q, k, v, scale);
    const torch::Tensor blocked = causal_attention(q, k, v, scale, /*max_block_bytes=*/H * L * 4 * 5);  // 5 rows
    const torch::Tensor single = causal_attention(q, k, v, scale, /*max_block_bytes=*/1);               // 1 row
    EXPECT_TRUE(torch::allclose(whole, blocked, 1e-6, 1e-6)) << T << "/" << L;
    EXPECT_TRUE(torch::allclose(whole, single, 1e-6, 1e-6)) << T << "/" << L;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t seen = L - T + i + 1;  // keys 0 .. L - T + i
      for (int64_t h = 0; h < H; ++h) {
        const torch::Tensor p = torch::softmax(k[h].narrow(0, 0, seen).matmul(q[i][h]) * scale, 0);
        const torch::Tensor o = p.matmul(v[h].narrow(0, 0, seen));
        EXPECT_TRUE(torch::allclose(whole[i].narrow(0, h * D, D), o, 1e-5, 1e-5)) << T << "/" << L << " row " << i;
      }
    }
  }
}

}  // namespace
}  // namespace troupe::model
