#include "model/paged_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "model/kernel_team.hpp"
#include "model/paged_attention_kernel.hpp"

namespace troupe::model {
namespace {

struct Item {
  int64_t seq, head, q_begin, q_end;  // rows [q_begin, q_end) of q, all of sequence `seq`
  int64_t cost;                       // query x key pairs, for longest-first ordering
  int64_t heads = 1;                  // heads [head, head + heads) (decode items only)
};

void check_common(const PagedAttentionInput& in, const char* who) {
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string(who) + ": " + what);
  };
  if (in.q.dim() != 3 || in.k_pool.dim() != 4 || in.v_pool.sizes() != in.k_pool.sizes())
    fail("want q [T, H, D] and k_pool, v_pool [blocks, H, block_size, D]");
  if (in.q.size(1) != in.k_pool.size(1) || in.q.size(2) != in.k_pool.size(3))
    fail("q and the pools disagree on heads or head_dim");
  const size_t S = in.context_lens.size();
  if (in.query_start.size() != S + 1 || in.query_start.front() != 0 || in.query_start.back() != in.q.size(0))
    fail("query_start must have S + 1 entries from 0 to T");
  if (in.block_tables.dim() != 2 || in.block_tables.size(0) != static_cast<int64_t>(S))
    fail("block_tables must be [S, max_blocks]");
}

}  // namespace

AttendTileFn attend_tile_kernel(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAvx512:
      return avx512::attend_tile;
    case CpuIsa::kAvx2:
      return avx2::attend_tile;
    case CpuIsa::kPortable:
      return portable::attend_tile;
  }
  return portable::attend_tile;
}

torch::Tensor paged_attention_cpu(const PagedAttentionInput& in) {
  check_common(in, "paged_attention_cpu");
  if (!in.q.device().is_cpu() || !in.k_pool.device().is_cpu() || !in.v_pool.device().is_cpu())
    throw std::invalid_argument(
        "paged_attention_cpu: q and the pools must be CPU tensors; use the gather path");
  const auto kv_type = in.k_pool.scalar_type();
  if (in.q.scalar_type() != torch::kFloat32 || in.v_pool.scalar_type() != kv_type ||
      (kv_type != torch::kFloat32 && kv_type != torch::kBFloat16))
    throw std::invalid_argument("paged_attention_cpu: q must be fp32 and the pools both fp32 or both bfloat16");
  if (!in.k_pool.is_contiguous() || !in.v_pool.is_contiguous())
    throw std::invalid_argument("paged_attention_cpu: the pools must be contiguous");

  const torch::Tensor q = in.q.stride(2) == 1 ? in.q : in.q.contiguous();
  // The engine's tables are int32 CPU already (Gpt2::forward_step): no op then.
  const torch::Tensor& tables = in.block_tables;
  const torch::Tensor bt =
      tables.device().is_cpu() && tables.scalar_type() == torch::kInt && tables.is_contiguous()
          ? tables
          : tables.to(torch::kCPU, torch::kInt).contiguous();
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), bs = in.k_pool.size(2);
  const float scale = static_cast<float>(in.scale > 0.0 ? in.scale : 1.0 / std::sqrt(static_cast<double>(D)));
  torch::Tensor out = at::empty({T, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));

  const int64_t S = static_cast<int64_t>(in.context_lens.size());
  // A decode row takes all its sequence's heads in one item (attend_heads
  // streams each block once) when there are sequences enough to keep every
  // thread busy; else one item per head, as a prefill tile.
  const bool whole_decodes = S >= 2 * static_cast<int64_t>(kernel_threads());
  std::vector<Item> items;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q0 = in.query_start[s], q1 = in.query_start[s + 1], ctx = in.context_lens[s];
    if (whole_decodes && q1 - q0 == 1 && H > 1) {
      items.push_back({s, 0, q0, q1, H * ctx, H});
      continue;
    }
    for (int64_t t = q0; t < q1; t += kAttentionQueryTile) {
      const int64_t te = std::min(q1, t + kAttentionQueryTile);
      const int64_t last_pos = ctx - (q1 - (te - 1));
      for (int64_t h = 0; h < H; ++h) items.push_back({s, h, t, te, (te - t) * (last_pos + 1)});
    }
  }
  // Longest first; items write disjoint outputs, so their order changes no bits.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });

  const float* qp = q.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  const void* kp = in.k_pool.data_ptr();
  const void* vp = in.v_pool.data_ptr();
  const bool kv_bfloat16 = kv_type == torch::kBFloat16;
  const int32_t* btp = bt.data_ptr<int32_t>();
  const int64_t bt_stride = bt.size(1);
  float* op = out.data_ptr<float>();
  const int64_t n_items = static_cast<int64_t>(items.size());
  const AttendTileFn attend = attend_tile_kernel(kernel_isa());

  auto process = [&](const Item& it, float* buf) {
    const int64_t q1 = in.query_start[it.seq + 1], ctx = in.context_lens[it.seq];
    AttentionTile t;
    t.q = qp + it.q_begin * qs0 + it.head * qs1;
    t.q_stride = qs0;
    t.k_pool = kp;
    t.v_pool = vp;
    t.kv_bfloat16 = kv_bfloat16;
    t.table = btp + it.seq * bt_stride;
    t.n_head = H;
    t.head = it.head;
    t.head_dim = D;
    t.block_size = bs;
    t.first_pos = ctx - (q1 - it.q_begin);
    t.rows = it.q_end - it.q_begin;
    t.scale = scale;
    t.out = op + (it.q_begin * H + it.head) * D;
    t.out_stride = H * D;
    t.heads = it.heads;
    t.q_head_stride = qs1;
    t.out_head_stride = D;
    attend(t, buf);
  };

  // Dynamic scheduling: items differ in cost by orders of magnitude (a long
  // prefill tile next to a short decode), so threads pull the next item.
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(kernel_threads(), n_items));
  const size_t scratch = static_cast<size_t>(attention_scratch_floats(D, bs, H));
  kernel_parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    // Per thread, kept between calls (the kernels set what they read of it).
    thread_local std::vector<float> buf;
    if (buf.size() < scratch) buf.resize(scratch);
    for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) process(items[i], buf.data());
  });
  return out;
}

torch::Tensor paged_attention_gather(const PagedAttentionInput& in) {
  check_common(in, "paged_attention_gather");
  const torch::Tensor& q = in.q;
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t nb = in.k_pool.size(0), bs = in.k_pool.size(2);
  const double scale = in.scale > 0.0 ? in.scale : 1.0 / std::sqrt(static_cast<double>(D));
  const auto dev = q.device();
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  torch::Tensor out = at::empty({T, H, D}, q.options());
  // Padding entries may hold anything; clamp so the padded gather stays in range.
  const torch::Tensor tables = in.block_tables.to(dev, torch::kLong).clamp(0, nb - 1);
  const torch::Tensor heads = at::arange(H, long_opts.device(dev));

  std::vector<int64_t> dec_seq, dec_row, dec_ctx;
  const int64_t S = static_cast<int64_t>(in.context_lens.size());
  for (int64_t s = 0; s < S; ++s) {
    if (in.query_start[s + 1] - in.query_start[s] == 1) {
      dec_seq.push_back(s);
      dec_row.push_back(in.query_start[s]);
      dec_ctx.push_back(in.context_lens[s]);
    }
  }
  if (!dec_seq.empty()) {
    const int64_t Sd = static_cast<int64_t>(dec_seq.size());
    const int64_t max_ctx = *std::max_element(dec_ctx.begin(), dec_ctx.end());
    const int64_t nblk = (max_ctx + bs - 1) / bs, L = nblk * bs;
    const torch::Tensor seq_t = torch::tensor(dec_seq, long_opts).to(dev);
    const torch::Tensor row_t = torch::tensor(dec_row, long_opts).to(dev);
    const torch::Tensor ctx_t = torch::tensor(dec_ctx, long_opts).to(dev);
    // One gather straight into [Sd, H, L, D]: the pool viewed as rows of
    // (block, head) tiles, picked in (sequence, head, block) order.
    const torch::Tensor rows_idx =
        (tables.index_select(0, seq_t).narrow(1, 0, nblk).unsqueeze(1) * H + heads.view({1, H, 1}))
            .reshape({-1});
    auto gather = [&](const torch::Tensor& pool) {
      return pool.view({nb * H, bs * D}).index_select(0, rows_idx).view({Sd, H, L, D}).to(q.scalar_type());
    };
    const torch::Tensor K = gather(in.k_pool), V = gather(in.v_pool);
    torch::Tensor sc = at::matmul(q.index_select(0, row_t).unsqueeze(2), K.transpose(2, 3)).mul_(scale);
    const torch::Tensor mask = at::arange(L, long_opts.device(dev)).unsqueeze(0) >= ctx_t.unsqueeze(1);
    sc.masked_fill_(mask.view({Sd, 1, 1, L}), neg_inf);
    // Padded positions (past a sequence's context, or whole blocks its table
    // pads with 0) hold whatever an earlier sequence left, NaN included; a
    // zero weight times NaN is NaN, so their values are zeroed too (V is
    // this call's own gathered copy).
    V.masked_fill_(mask.view({Sd, 1, L, 1}), 0.0f);
    out.index_copy_(0, row_t, at::matmul(at::softmax(sc, -1), V).squeeze(2));
  }
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q0 = in.query_start[s], nq = in.query_start[s + 1] - q0, ctx = in.context_lens[s];
    if (nq <= 1) continue;
    const int64_t nblk = (ctx + bs - 1) / bs;
    const torch::Tensor rows_idx =
        (tables[s].narrow(0, 0, nblk).unsqueeze(0) * H + heads.view({H, 1})).reshape({-1});
    auto gather = [&](const torch::Tensor& pool) {
      return pool.view({nb * H, bs * D})
          .index_select(0, rows_idx)
          .view({H, nblk * bs, D})
          .narrow(1, 0, ctx)
          .to(q.scalar_type());
    };
    const torch::Tensor K = gather(in.k_pool), V = gather(in.v_pool);
    torch::Tensor sc = at::matmul(q.narrow(0, q0, nq).transpose(0, 1), K.transpose(1, 2)).mul_(scale);
    // Row i sits at position ctx - nq + i: keys after it are masked.
    const torch::Tensor mask =
        at::ones({nq, ctx}, torch::TensorOptions().dtype(torch::kBool).device(dev)).triu_(ctx - nq + 1);
    sc.masked_fill_(mask, neg_inf);
    out.narrow(0, q0, nq).copy_(at::matmul(at::softmax(sc, -1), V).transpose(0, 1));
  }
  return out;
}

}  // namespace troupe::model
