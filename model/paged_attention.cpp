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

namespace troupe::model {
namespace {

// Queries of one sequence that share a pass over its K/V blocks: each block
// is loaded once per tile and stays in L1 (16 x 64 fp32 = 4 KiB).
constexpr int64_t kQueryTile = 8;
// Independent partial sums, so -O3 vectorises the dot product without
// reassociating one serial float sum (which it may not do without -ffast-math).
constexpr int kLanes = 16;
// Blocks ahead whose K/V are prefetched in software: blocks sit at random
// places in the pool and the hardware prefetcher stops at each one's page.
constexpr int64_t kPrefetchAhead = 2;

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[d + l] * b[d + l];
  float tail = 0.f;
  for (; d < n; ++d) tail += a[d] * b[d];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0] + tail;
}

// exp(x) for x <= 0 in plain float operations that -O3 vectorises (glibc's
// expf is a call per element). Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2,
// degree-5 polynomial for e^r, 2^n through the exponent bits; relative error
// below 1e-7 (checked on [-87, 0]). Inputs below -87 are clamped, giving ~1e-38 instead of 0.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float fx = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(fx) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(float));
  return y * two_n;
}

// sc[j] = exp(sc[j] - mx) for j < n; returns their sum.
inline float exp_shifted(float* __restrict sc, int64_t n, float mx) {
  for (int64_t j = 0; j < n; ++j) sc[j] = exp_nonpositive(sc[j] - mx);
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += sc[j];
  return sum;
}

// acc[0..D) += sum_j p[j] * v[j * D + 0..D), j < n. A chunk of acc lives in
// a fixed-size local across the keys, so it stays in vector registers.
inline void accumulate(const float* __restrict p, const float* __restrict v, int64_t n, int64_t D,
                       float* __restrict acc) {
  constexpr int64_t kChunk = 32;
  int64_t c = 0;
  for (; c + kChunk <= D; c += kChunk) {
    float a[kChunk];
    for (int64_t l = 0; l < kChunk; ++l) a[l] = acc[c + l];
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < kChunk; ++l) a[l] += p[j] * v[j * D + c + l];
    for (int64_t l = 0; l < kChunk; ++l) acc[c + l] = a[l];
  }
  for (; c < D; ++c)
    for (int64_t j = 0; j < n; ++j) acc[c] += p[j] * v[j * D + c];
}

inline void scale_in_place(float a, float* __restrict y, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] *= a;
}

struct Item {
  int64_t seq, head, q_begin, q_end;  // rows [q_begin, q_end) of q, all of sequence `seq`
  int64_t cost;                       // query x key pairs, for longest-first ordering
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

torch::Tensor paged_attention_cpu(const PagedAttentionInput& in) {
  check_common(in, "paged_attention_cpu");
  if (!in.q.device().is_cpu() || !in.k_pool.device().is_cpu() || !in.v_pool.device().is_cpu())
    throw std::invalid_argument("paged_attention_cpu: q and the pools must be CPU tensors; use the gather path");
  if (in.q.scalar_type() != torch::kFloat32 || in.k_pool.scalar_type() != torch::kFloat32 ||
      in.v_pool.scalar_type() != torch::kFloat32)
    throw std::invalid_argument("paged_attention_cpu: q and the pools must be fp32");
  if (!in.k_pool.is_contiguous() || !in.v_pool.is_contiguous())
    throw std::invalid_argument("paged_attention_cpu: the pools must be contiguous");

  const torch::Tensor q = in.q.stride(2) == 1 ? in.q : in.q.contiguous();
  const torch::Tensor bt = in.block_tables.to(torch::kCPU, torch::kInt).contiguous();
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), bs = in.k_pool.size(2);
  const float scale = static_cast<float>(in.scale > 0.0 ? in.scale : 1.0 / std::sqrt(static_cast<double>(D)));
  torch::Tensor out = at::empty({T, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));

  const int64_t S = static_cast<int64_t>(in.context_lens.size());
  std::vector<Item> items;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q0 = in.query_start[s], q1 = in.query_start[s + 1], ctx = in.context_lens[s];
    for (int64_t t = q0; t < q1; t += kQueryTile) {
      const int64_t te = std::min(q1, t + kQueryTile);
      const int64_t last_pos = ctx - (q1 - (te - 1));
      for (int64_t h = 0; h < H; ++h) items.push_back({s, h, t, te, (te - t) * (last_pos + 1)});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });

  const float* qp = q.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  const float* kp = in.k_pool.data_ptr<float>();
  const float* vp = in.v_pool.data_ptr<float>();
  const int32_t* btp = bt.data_ptr<int32_t>();
  const int64_t bt_stride = bt.size(1);
  float* op = out.data_ptr<float>();
  const int64_t n_items = static_cast<int64_t>(items.size());

  auto process = [&](const Item& it, float* buf) {
    const int64_t q1 = in.query_start[it.seq + 1], ctx = in.context_lens[it.seq];
    const int32_t* table = btp + it.seq * bt_stride;
    const int64_t nq = it.q_end - it.q_begin, h = it.head;
    float* qb = buf;                 // [kQueryTile, D] scaled queries
    float* acc = qb + kQueryTile * D;  // [kQueryTile, D] un-normalised outputs
    float* m = acc + kQueryTile * D;   // running max of the scores
    float* l = m + kQueryTile;         // running sum of exp(score - m)
    float* sc = l + kQueryTile;        // [bs] scores of one block
    int64_t pos[kQueryTile] = {};
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t row = it.q_begin + i;
      pos[i] = ctx - (q1 - row);
      const float* qr = qp + row * qs0 + h * qs1;
      for (int64_t d = 0; d < D; ++d) qb[i * D + d] = qr[d] * scale;
      std::fill(acc + i * D, acc + (i + 1) * D, 0.f);
      m[i] = -std::numeric_limits<float>::infinity();
      l[i] = 0.f;
    }
    const int64_t n_blocks = pos[nq - 1] / bs + 1;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t base = (static_cast<int64_t>(table[b]) * H + h) * bs * D;
      const float* kb = kp + base;
      const float* vb = vp + base;
      if (b + kPrefetchAhead < n_blocks) {
        const int64_t next = (static_cast<int64_t>(table[b + kPrefetchAhead]) * H + h) * bs * D;
        for (int64_t c = 0; c < bs * D; c += 64 / static_cast<int64_t>(sizeof(float))) {
          __builtin_prefetch(kp + next + c);
          __builtin_prefetch(vp + next + c);
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t n = std::min(bs, pos[i] + 1 - b * bs);
        if (n <= 0) continue;
        const float* qi = qb + i * D;
        float mx = m[i];
        for (int64_t j = 0; j < n; ++j) {
          sc[j] = dot(qi, kb + j * D, D);
          mx = std::max(mx, sc[j]);
        }
        float* ai = acc + i * D;
        if (mx > m[i]) {
          // Online softmax (Milakov & Gimelshein 2018): rescale what was summed
          // under the old max. exp(-inf) = 0 on the first block.
          const float corr = std::exp(m[i] - mx);
          l[i] *= corr;
          scale_in_place(corr, ai, D);
          m[i] = mx;
        }
        l[i] += exp_shifted(sc, n, mx);
        accumulate(sc, vb, n, D, ai);
      }
    }
    for (int64_t i = 0; i < nq; ++i) {
      float* o = op + ((it.q_begin + i) * H + h) * D;
      const float inv = 1.f / l[i];
      for (int64_t d = 0; d < D; ++d) o[d] = acc[i * D + d] * inv;
    }
  };

  // Dynamic scheduling: items differ in cost by orders of magnitude (a long
  // prefill tile next to a short decode), so threads pull the next item.
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n_items));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    std::vector<float> buf(static_cast<size_t>(2 * kQueryTile * D + 2 * kQueryTile + bs));
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
        (tables.index_select(0, seq_t).narrow(1, 0, nblk).unsqueeze(1) * H + heads.view({1, H, 1})).reshape({-1});
    auto gather = [&](const torch::Tensor& pool) {
      return pool.view({nb * H, bs * D}).index_select(0, rows_idx).view({Sd, H, L, D});
    };
    const torch::Tensor K = gather(in.k_pool), V = gather(in.v_pool);
    torch::Tensor sc = at::matmul(q.index_select(0, row_t).unsqueeze(2), K.transpose(2, 3)).mul_(scale);
    const torch::Tensor mask = at::arange(L, long_opts.device(dev)).unsqueeze(0) >= ctx_t.unsqueeze(1);
    sc.masked_fill_(mask.view({Sd, 1, 1, L}), neg_inf);
    out.index_copy_(0, row_t, at::matmul(at::softmax(sc, -1), V).squeeze(2));
  }
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q0 = in.query_start[s], nq = in.query_start[s + 1] - q0, ctx = in.context_lens[s];
    if (nq <= 1) continue;
    const int64_t nblk = (ctx + bs - 1) / bs;
    const torch::Tensor rows_idx = (tables[s].narrow(0, 0, nblk).unsqueeze(0) * H + heads.view({H, 1})).reshape({-1});
    auto gather = [&](const torch::Tensor& pool) {
      return pool.view({nb * H, bs * D}).index_select(0, rows_idx).view({H, nblk * bs, D}).narrow(1, 0, ctx);
    };
    const torch::Tensor K = gather(in.k_pool), V = gather(in.v_pool);
    torch::Tensor sc = at::matmul(q.narrow(0, q0, nq).transpose(0, 1), K.transpose(1, 2)).mul_(scale);
    // Row i sits at position ctx - nq + i: keys after it are masked.
    const torch::Tensor mask = at::ones({nq, ctx}, torch::TensorOptions().dtype(torch::kBool).device(dev))
                                   .triu_(ctx - nq + 1);
    sc.masked_fill_(mask, neg_inf);
    out.narrow(0, q0, nq).copy_(at::matmul(at::softmax(sc, -1), V).transpose(0, 1));
  }
  return out;
}

}  // namespace troupe::model
