#include "model/sampler.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "model/sampler_kernels.hpp"

namespace troupe::model {
namespace {

// splitmix64 (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number
// generators"): the row key from (seed, position), once per row.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t row_key(uint64_t seed, int64_t position) {
  return splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(position));
}

// Rank order: higher logit first, lower id on ties. A strict weak order
// because NaN is rejected before any ranking.
struct RanksBefore {
  const float* l;
  bool operator()(int32_t a, int32_t b) const { return l[a] > l[b] || (l[a] == l[b] && a < b); }
};

// The n best ids in rank order (n <= vocab); s is the row's scan.
void top_ids(const SamplerKernels& k, const float* l, int64_t vocab, int64_t n, const LogitScan& s,
             std::vector<int32_t>& out) {
  const RanksBefore before{l};
  out.clear();
  if (n <= 0) return;
  if (n <= 256) {
    // Bounded heap whose front is the worst kept id, and a bound below which
    // no id can enter: ids under it are skipped 64 vectorised comparisons at
    // a time. Up to kMaxLanes ids the bound starts at the n-th largest of
    // the row's lane maxima (scan's; n ids reach it, so the n best all do): on a
    // flat row the heap then sees a few dozen ids instead of the hundreds a
    // bound rising from the first n would let in.
    out.reserve(n);
    float bound = -INFINITY;
    if (n <= kMaxLanes && vocab >= 16 * kMaxLanes) {
      float lanes[kMaxLanes];
      std::copy_n(s.lane_max, kMaxLanes, lanes);
      std::nth_element(lanes, lanes + (n - 1), lanes + kMaxLanes, std::greater<float>());
      bound = lanes[n - 1];
    }
    for (int64_t i = k.next_at_least(l, 0, vocab, bound); i < vocab;
         i = k.next_at_least(l, i + 1, vocab, bound)) {
      const int32_t id = static_cast<int32_t>(i);
      if (static_cast<int64_t>(out.size()) < n) {
        out.push_back(id);
        std::push_heap(out.begin(), out.end(), before);
        if (static_cast<int64_t>(out.size()) == n) bound = std::max(bound, l[out.front()]);
      } else if (before(id, out.front())) {
        std::pop_heap(out.begin(), out.end(), before);
        out.back() = id;
        std::push_heap(out.begin(), out.end(), before);
        bound = l[out.front()];
      }
    }
    std::sort_heap(out.begin(), out.end(), before);
    return;
  }
  out.resize(vocab);
  for (int32_t i = 0; i < vocab; ++i) out[i] = i;
  std::nth_element(out.begin(), out.begin() + (n - 1), out.end(), before);
  out.resize(n);
  std::sort(out.begin(), out.end(), before);
}

// Top-p needs the rank-order prefix of the kept ids whose mass reaches a
// threshold. The ids are split into rank-ordered buckets: every id of bucket
// b ranks before every id of bucket b+1, and mass[b] is the sum of their
// weights. The ids of a bucket are gathered and sorted only when the walk
// stops in it, so finding the crossing costs a few O(vocab) passes plus
// sorting one small bucket, never a sort of the vocabulary.
constexpr int kBuckets = 1024;

// Per-thread buffers reused across rows (no allocation per token).
struct Scratch {
  std::vector<float> w;          // weight of each id (meaningful for kept ids)
  std::vector<int32_t> key;      // bucket of each id
  std::vector<double> mass;      // per bucket
  std::vector<double> partial;   // 4 interleaved histograms of the masses
  std::vector<int32_t> members;  // ids of bucket `gathered`, in rank order
  std::vector<int32_t> found;    // room for collect(): a whole row's ids
  int gathered = -1;
  int last_positive = -1;                        // last bucket with mass > 0
  std::vector<float> kept_logits, kept_weights;  // logits and weights of `members`
  // w holds exp((l - max) * exp_scale) of every id of the row at exp_of
  // (set by weigh_all; null otherwise), and `total` their sum. Valid within
  // one sample() call only.
  const float* exp_of = nullptr;
  float exp_scale = 0;
  double total = 0;
};

Scratch& scratch() {
  thread_local Scratch sc;
  return sc;
}

void gather(const SamplerKernels& k, Scratch& sc, int b, int64_t vocab, const RanksBefore& before) {
  if (sc.gathered == b) return;
  if (static_cast<int64_t>(sc.found.size()) < vocab) sc.found.resize(vocab);  // once: no fill per row
  const int64_t n = k.collect(sc.key.data(), vocab, b, sc.found.data());
  sc.members.assign(sc.found.begin(), sc.found.begin() + n);
  std::sort(sc.members.begin(), sc.members.end(), before);
  sc.gathered = b;
}

// The last kept id of a nucleus: `index` in the rank order of bucket `bucket`
// (whose ids are then gathered in sc.members).
struct Crossing {
  int bucket = -1;
  int64_t index = -1;
};

// The weight of the whole row: the sum of bucket_all's bucket masses.
double bucket_total(const Scratch& sc) {
  double total = 0;
  for (int b = 0; b <= sc.last_positive; ++b) total += sc.mass[b];
  return total;
}

// First id (in rank order) at which the cumulative weight reaches
// top_p * total, skipping zero weights; when rounding leaves it unreached,
// the last id of positive weight.
Crossing nucleus_cut(const SamplerKernels& k, Scratch& sc, int64_t vocab, const RanksBefore& before,
                     float top_p) {
  // The best id has weight exactly 1, so the total is >= 1 and the walk
  // always finds an id.
  const double total = bucket_total(sc);
  const double t = static_cast<double>(top_p) * total;
  double cum = 0;
  Crossing last;
  for (int b = 0; b <= sc.last_positive; ++b) {
    const double m = sc.mass[b];
    if (m == 0) continue;
    if (cum + m >= t || b == sc.last_positive) {
      gather(k, sc, b, vocab, before);
      double c = cum;
      for (int64_t j = 0; j < static_cast<int64_t>(sc.members.size()); ++j) {
        const float wi = sc.w[sc.members[j]];
        if (wi == 0) continue;
        c += wi;
        last = {b, j};
        if (c >= t) return last;
      }
    }
    cum += m;
  }
  return last;
}

// Every id's weight into sc.w (once per row and temperature).
void weigh_all(const SamplerKernels& k, const float* l, int64_t vocab, const LogitScan& s, float inv_t,
               Scratch& sc) {
  if (sc.exp_of == l && sc.exp_scale == inv_t) return;
  sc.w.resize(vocab);
  k.exp_shifted(l, vocab, s.max, inv_t, sc.w.data());
  sc.exp_of = l;
  sc.exp_scale = inv_t;
}

// Every id of the row, weighted, in kBuckets buckets spread linearly over the
// logit range that carries weight (below max - 87 T the weights are 0).
void bucket_all(const SamplerKernels& k, const float* l, int64_t vocab, const LogitScan& s, float inv_t,
                Scratch& sc) {
  weigh_all(k, l, vocab, s, inv_t, sc);
  sc.key.resize(vocab);
  const float range = std::min(s.max - s.min_finite, 87.0f / inv_t);
  const float scale = range > 0 ? static_cast<float>(kBuckets) / range : 0.0f;
  const int32_t* key = sc.key.data();
  k.bucket_keys(l, vocab, s.max, scale, kBuckets, sc.key.data());
  // Four interleaved histograms so consecutive ids in one bucket do not wait
  // on each other's store.
  sc.partial.assign(4 * kBuckets, 0.0);
  double* h = sc.partial.data();
  const float* w = sc.w.data();
  int64_t i = 0;
  for (; i + 4 <= vocab; i += 4) {
    h[key[i]] += w[i];
    h[kBuckets + key[i + 1]] += w[i + 1];
    h[2 * kBuckets + key[i + 2]] += w[i + 2];
    h[3 * kBuckets + key[i + 3]] += w[i + 3];
  }
  for (; i < vocab; ++i) h[key[i]] += w[i];
  sc.mass.resize(kBuckets);
  sc.last_positive = -1;
  for (int b = 0; b < kBuckets; ++b) {
    sc.mass[b] = ((h[b] + h[kBuckets + b]) + h[2 * kBuckets + b]) + h[3 * kBuckets + b];
    if (sc.mass[b] > 0) sc.last_positive = b;
  }
  sc.gathered = -1;
  sc.total = bucket_total(sc);
}

// The top_k ids as one bucket, already in rank order, with their logits and
// weights.
void bucket_top_k(const SamplerKernels& kern, const float* l, int64_t vocab, int64_t k, const LogitScan& s,
                  float inv_t, Scratch& sc) {
  top_ids(kern, l, vocab, k, s, sc.members);
  sc.exp_of = nullptr;  // w is written for the top k only
  sc.w.resize(vocab);
  sc.kept_logits.resize(k);
  sc.kept_weights.resize(k);
  for (int64_t j = 0; j < k; ++j) sc.kept_logits[j] = l[sc.members[j]];
  kern.exp_shifted(sc.kept_logits.data(), k, s.max, inv_t, sc.kept_weights.data());
  double m = 0;
  for (int64_t j = 0; j < k; ++j) {
    sc.w[sc.members[j]] = sc.kept_weights[j];
    m += sc.kept_weights[j];
  }
  sc.mass.assign(1, m);
  sc.gathered = 0;
  sc.last_positive = m > 0 ? 0 : -1;
}

// Top-p from this value up first tries the whole row's winner (draw()): it
// lies in the nucleus with probability ~top_p and then saves the bucket walk;
// below, the failed try costs more than it saves (measured, bench_sampler:
// the try ~45 us of a flat 50257-id row, the walk ~70 us more).
constexpr float kWinnerFirstFrom = 0.6f;

int32_t draw(const SamplerKernels& k, const float* l, int64_t vocab, const SamplingParams& p,
             int64_t position, const LogitScan& s) {
  Scratch& sc = scratch();
  const float inv_t = 1.0f / p.temperature;
  const uint64_t key = row_key(p.seed, position);
  const bool nucleus = p.top_p < 1.0f;
  // Kept ids listed in rank order (members[0] is the best, scored first).
  auto best_member = [&](int64_t kept) {
    return k.gumbel_argmax(sc.kept_logits.data(), sc.members.data(), kept, s.max, inv_t, key, nullptr, 0, 0);
  };
  if (p.top_k > 0 && p.top_k < vocab) {
    bucket_top_k(k, l, vocab, p.top_k, s, inv_t, sc);
    const int64_t kept = nucleus ? nucleus_cut(k, sc, vocab, RanksBefore{l}, p.top_p).index + 1 : p.top_k;
    return sc.members[best_member(kept).index];
  }
  if (!nucleus)
    return static_cast<int32_t>(
        k.gumbel_argmax(l, nullptr, vocab, s.max, inv_t, key, nullptr, 0, s.argmax).index);
  if (p.top_p >= kWinnerFirstFrom) {
    // The nucleus is a rank-order prefix of the row and its ids keep their
    // scores, so when the whole row's winner lies in it, it is the nucleus's
    // winner too. It does when the weight of the ids ranked before it is
    // below top_p of the total (then the walk cannot have stopped earlier):
    // with probability ~top_p, at the cost of the row's Gumbel-max and one
    // pass that weighs every id; otherwise the walk below (the weights kept).
    const GumbelWinner row = k.gumbel_argmax(l, nullptr, vocab, s.max, inv_t, key, nullptr, 0, s.argmax);
    weigh_all(k, l, vocab, s, inv_t, sc);
    double ahead = 0;
    k.sums_ranked_before(l, sc.w.data(), vocab, row.index, &sc.total, &ahead);
    if (ahead < static_cast<double>(p.top_p) * sc.total) return static_cast<int32_t>(row.index);
  }
  bucket_all(k, l, vocab, s, inv_t, sc);
  const Crossing cut = nucleus_cut(k, sc, vocab, RanksBefore{l}, p.top_p);
  // Kept: every id of the buckets before the cut's, and the cut bucket's
  // members up to the cut.
  const int64_t head = cut.index + 1;
  sc.kept_logits.resize(head);
  for (int64_t j = 0; j < head; ++j) sc.kept_logits[j] = l[sc.members[j]];
  const GumbelWinner in_head = best_member(head);
  const int32_t head_id = sc.members[in_head.index];
  if (cut.bucket == 0) return head_id;
  // The argmax is in bucket 0, below the cut's: a candidate to start from.
  GumbelWinner before;
  int32_t before_id;
  if (p.top_p < kWinnerFirstFrom) {
    // A small nucleus: the ids of the buckets before the cut's gathered
    // first, so that only they are hashed (the mask below would hash every
    // id of the row). The same winner: the same candidates and scores.
    if (static_cast<int64_t>(sc.found.size()) < vocab) sc.found.resize(vocab);
    const int64_t n = k.collect_below(sc.key.data(), vocab, cut.bucket, sc.found.data());
    sc.kept_logits.resize(n);
    for (int64_t j = 0; j < n; ++j) sc.kept_logits[j] = l[sc.found[j]];
    const int64_t start =
        std::lower_bound(sc.found.begin(), sc.found.begin() + n, s.argmax) - sc.found.begin();
    before = k.gumbel_argmax(sc.kept_logits.data(), sc.found.data(), n, s.max, inv_t, key, nullptr, 0, start);
    before_id = sc.found[before.index];
  } else {
    before = k.gumbel_argmax(l, nullptr, vocab, s.max, inv_t, key, sc.key.data(), cut.bucket, s.argmax);
    before_id = static_cast<int32_t>(before.index);
  }
  const bool head_wins =
      in_head.score > before.score || (in_head.score == before.score && head_id < before_id);
  return head_wins ? head_id : before_id;
}

void fill_logprobs(const SamplerKernels& k, const float* l, int64_t vocab, const LogitScan& s, int32_t n_top,
                   SampledToken& out) {
  thread_local std::vector<float> e;
  thread_local std::vector<int32_t> ids;
  const Scratch& sc = scratch();
  double total;
  if (sc.exp_of == l && sc.exp_scale == 1.0f) {
    total = sc.total;  // top-p at T 1 has weighed every id and summed them
  } else {
    e.resize(vocab);
    k.exp_shifted(l, vocab, s.max, 1.0f, e.data());
    total = k.sum(e.data(), vocab);
  }
  const double lse = static_cast<double>(s.max) + std::log(total);
  out.logprob = static_cast<float>(l[out.id] - lse);
  top_ids(k, l, vocab, std::min<int64_t>(n_top, vocab), s, ids);
  out.top.clear();
  out.top.reserve(ids.size());
  for (int32_t id : ids) out.top.emplace_back(id, static_cast<float>(l[id] - lse));
}

// The row with p's adjustments applied (sample()'s order and rounding), in a
// buffer of the calling thread's that lives until its next call.
const float* adjusted_row(const float* logits, int64_t vocab, const SamplingParams& p, History history) {
  thread_local std::vector<float> row;
  thread_local std::vector<int32_t> ids;
  row.assign(logits, logits + vocab);
  auto outside = [&](const char* what, int32_t id) {
    return std::invalid_argument(std::string("sampling: ") + what + " names token " + std::to_string(id) +
                                 ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
  };
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab) throw outside("logit_bias", id);
    row[id] = row[id] + bias;
  }
  // Each distinct id of ids[from, size) once, with how often it occurs.
  auto each_distinct = [&](size_t from, auto&& f) {
    ids.assign(history.ids + from, history.ids + history.size);
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      const int32_t id = ids[i];
      if (id < 0 || id >= vocab) throw outside("an earlier token", id);
      size_t j = i;
      while (j < ids.size() && ids[j] == id) ++j;
      f(id, static_cast<float>(j - i));
      i = j;
    }
  };
  if (p.repeats_prompt()) {
    const float r = p.repetition_penalty;
    each_distinct(0, [&](int32_t id, float) { row[id] = row[id] > 0.0f ? row[id] / r : row[id] * r; });
  }
  if (p.counts_generated() && history.size > history.prompt) {
    each_distinct(history.prompt, [&](int32_t id, float count) {
      row[id] = row[id] - (p.frequency_penalty * count + p.presence_penalty);
    });
  }
  return row.data();
}

}  // namespace

// The portable variant gives the same bits as every other and runs anywhere.
float gumbel_noise(uint64_t seed, int64_t position, int32_t token) {
  return sampler_kernels(CpuIsa::kPortable).noise(row_key(seed, position), token);
}

uint32_t gumbel_noise_bits(uint64_t seed, int64_t position, int32_t token) {
  return sampler_kernels(CpuIsa::kPortable).noise_bits(row_key(seed, position), token);
}

const SamplerKernels& sampler_kernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAvx512:
      return avx512::kSamplerKernels;
    case CpuIsa::kAvx2:
      return avx2::kSamplerKernels;
    case CpuIsa::kPortable:
      return portable::kSamplerKernels;
  }
  return portable::kSamplerKernels;
}

SampledToken sample(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position,
                    History history) {
  validate(p);
  if (vocab < 1) throw std::invalid_argument("sampling: vocab must be >= 1, got " + std::to_string(vocab));
  const SamplerKernels& k = sampler_kernels(kernel_isa());
  const LogitScan raw = k.scan(logits, vocab);
  if (raw.bad) throw std::runtime_error("sampler: logits contain NaN or +inf (the forward pass diverged)");
  if (raw.max == -INFINITY) throw std::runtime_error("sampler: every logit is -inf, nothing can be sampled");
  // The adjustments are finite (bounded biases and penalties), so the
  // adjusted row has no NaN or +inf and keeps every finite logit finite.
  const float* l = p.adjusts_logits() ? adjusted_row(logits, vocab, p, history) : logits;
  const LogitScan s = l == logits ? raw : k.scan(l, vocab);
  SampledToken out;
  scratch().exp_of = nullptr;  // nothing computed for an earlier row is reused
  // A temperature so small that 1/T overflows is greedy in all but name.
  const bool greedy = p.temperature == 0.0f || !std::isfinite(1.0f / p.temperature);
  out.id = greedy ? s.argmax : draw(k, l, vocab, p, position, s);
  if (p.logprobs >= 0) fill_logprobs(k, logits, vocab, raw, p.logprobs, out);
  return out;
}

SampledToken score(const float* logits, int64_t vocab, int32_t id, int32_t n_top) {
  if (vocab < 1 || id < 0 || id >= vocab)
    throw std::invalid_argument("score: token " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(vocab) + ")");
  if (n_top < 0 || n_top > kMaxLogprobs)
    throw std::invalid_argument("score: n_top must be in [0, " + std::to_string(kMaxLogprobs) + "], got " +
                                std::to_string(n_top));
  const SamplerKernels& k = sampler_kernels(kernel_isa());
  const LogitScan raw = k.scan(logits, vocab);
  if (raw.bad) throw std::runtime_error("score: logits contain NaN or +inf (the forward pass diverged)");
  if (raw.max == -INFINITY) throw std::runtime_error("score: every logit is -inf");
  SampledToken out;
  out.id = id;
  scratch().exp_of = nullptr;  // nothing computed for an earlier row is reused
  fill_logprobs(k, logits, vocab, raw, n_top, out);
  const float x = logits[id];
  int32_t above = 0;
  for (int64_t i = 0; i < vocab; ++i) above += logits[i] > x ? 1 : 0;
  out.rank = 1 + above;
  return out;
}

std::vector<SampledToken> score_rows(const at::Tensor& logits, const std::vector<int32_t>& ids,
                                     const std::vector<int32_t>& n_top) {
  if (logits.dim() != 2 || !at::isFloatingType(logits.scalar_type()))
    throw std::invalid_argument("score_rows: logits must be a floating [rows, vocab] tensor");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (static_cast<int64_t>(ids.size()) != rows || static_cast<int64_t>(n_top.size()) != rows)
    throw std::invalid_argument("score_rows: " + std::to_string(rows) + " logit rows but " +
                                std::to_string(ids.size()) + " ids and " + std::to_string(n_top.size()) + " n_top");
  std::vector<SampledToken> out(rows);
  if (rows == 0) return out;
  const at::Tensor cpu = logits.to(at::kCPU, at::kFloat).contiguous();
  const float* base = cpu.data_ptr<float>();
  // An exception inside parallel_for is rethrown on the caller's thread.
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) out[r] = score(base + r * vocab, vocab, ids[r], n_top[r]);
  });
  return out;
}

std::vector<SampledToken> sample_rows(const at::Tensor& logits, const std::vector<SamplingParams>& params,
                                      const std::vector<int64_t>& positions,
                                      const std::vector<History>& history) {
  if (logits.dim() != 2 || !at::isFloatingType(logits.scalar_type()))
    throw std::invalid_argument("sample_rows: logits must be a floating [rows, vocab] tensor, got " +
                                std::to_string(logits.dim()) + " dims");
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  if (static_cast<int64_t>(params.size()) != rows || static_cast<int64_t>(positions.size()) != rows)
    throw std::invalid_argument("sample_rows: " + std::to_string(rows) + " logit rows but " +
                                std::to_string(params.size()) + " params and " +
                                std::to_string(positions.size()) + " positions");
  if (!history.empty() && static_cast<int64_t>(history.size()) != rows)
    throw std::invalid_argument("sample_rows: " + std::to_string(rows) + " logit rows but " +
                                std::to_string(history.size()) + " histories");
  for (const auto& p : params) validate(p, vocab);
  std::vector<SampledToken> out(rows);
  if (rows == 0) return out;
  const at::Tensor cpu = logits.to(at::kCPU, at::kFloat).contiguous();
  const float* base = cpu.data_ptr<float>();
  // Rows pulled one at a time: their costs differ by 2-10x (greedy next to
  // top-p, or a top-p row whose winner is in the nucleus next to one whose
  // is not), which even halves would leave one thread waiting on the other.
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t r = next.fetch_add(1); r < rows; r = next.fetch_add(1))
      out[r] =
          sample(base + r * vocab, vocab, params[r], positions[r], history.empty() ? History{} : history[r]);
  });
  return out;
}

}  // namespace troupe::model
