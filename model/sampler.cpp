#include "model/sampler.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::model {
namespace {

// The weights exp((l - max) / T) and the Gumbel noise use these polynomial
// exp and log (Cephes expf and logf, ~1 ulp) rather than libm so that they
// are the same bits on every machine; GCC contracts a*b+c into FMA by
// default, which would make them depend on the ISA, so contraction is off
// until the matching pop_options. The loops vectorise.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
// out[i] = exp((x[i] - shift) * scale) for x[i] <= shift, 0 below exp's range.
void exp_shifted(const float* x, int64_t n, float shift, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = (x[i] - shift) * scale;
    const float v = std::max(a, -87.0f);
    float fx = v * 1.44269504088896341f;
    fx = (fx + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
    const float r = v - fx * 0.693359375f - fx * -2.12194440e-4f;
    const float r2 = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r2 + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(fx) + 127) << 23;
    float pow2;
    std::memcpy(&pow2, &bits, sizeof pow2);
    out[i] = a < -87.0f ? 0.0f : y * pow2;
  }
}

// Natural log of a positive normal float (Cephes logf, ~1 ulp), branch-free
// so that loops calling it vectorise.
inline float log_positive(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  int32_t e = ((bits >> 23) & 0xff) - 126;
  bits = (bits & 0x007fffff) | 0x3f000000;  // mantissa in [0.5, 1)
  float m;
  std::memcpy(&m, &bits, sizeof m);
  const bool low = m < 0.707106781186547524f;
  e -= low ? 1 : 0;
  m = low ? (m + m) - 1.0f : m - 1.0f;  // log(x) = e ln2 + log(1 + m), |m| < 0.42
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = (y * m) * z;
  const float fe = static_cast<float>(e);
  y = y + fe * -2.12194440e-4f;
  y = y - 0.5f * z;
  return (m + y) + fe * 0.693359375f;
}

// Standard Gumbel noise -log(E) with E = -log1p(-v) ~ Exp(1) from the top 31
// bits of a hash. The winner of a row of n tokens typically has E ~ 1/n, so E
// must be accurate for tiny v: v keeps full relative precision (it is built
// from an integer, not as 1 - u), and log1p(x) = log(u) + (x - (u - 1)) / u
// with u = fl(1 + x), where x - (u - 1) is the exact rounding error of u (the
// correction of fdlibm's log1p). No data-dependent branch, so the loops
// calling it vectorise.
inline float gumbel_from_hash(uint64_t h) {
  // k - k / 2^24 is at most 2^31 - 128, so the conversion cannot round up to
  // 2^31 (v = 1); it leaves k < 2^24 (small v) unchanged. A clamp would do
  // the same but GCC turns it into a branch and the loop no longer vectorises.
  const int32_t k = static_cast<int32_t>(h >> 33);
  const float v = (static_cast<float>(k - (k >> 24)) + 0.5f) * 0x1p-31f;  // (0, 1 - 2^-24]
  const float u = 1.0f - v;
  const float e = (v + (u - 1.0f)) / u - log_positive(u);
  return -log_positive(e);
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t splitmix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The noise of token id in the row keyed `key` is the (id + 1)-th output of
// the splitmix64 stream started at `key`.
inline float token_gumbel(uint64_t key, int32_t id) {
  return gumbel_from_hash(splitmix64(key + static_cast<uint64_t>(id) * kGolden));
}

// out[j] = (x[j] - shift) * inv_t + noise of id (ids ? ids[j] : j): the
// perturbed scores of the Gumbel-max trick. Both loops vectorise.
void perturbed_scores(const float* x, const int32_t* ids, int64_t n, float shift, float inv_t,
                      uint64_t key, float* out) {
  if (ids) {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - shift) * inv_t + token_gumbel(key, ids[j]);
  } else {
    for (int64_t j = 0; j < n; ++j)
      out[j] = (x[j] - shift) * inv_t + token_gumbel(key, static_cast<int32_t>(j));
  }
}
#pragma GCC pop_options

uint64_t row_key(uint64_t seed, int64_t position) {
  return splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(position));
}

// Rank order: higher logit first, lower id on ties. A strict weak order
// because NaN is rejected before any ranking.
struct RanksBefore {
  const float* l;
  bool operator()(int32_t a, int32_t b) const { return l[a] > l[b] || (l[a] == l[b] && a < b); }
};

// Reductions below keep kLanes independent accumulators (combined in a fixed
// order at the end) so they vectorise without reassociating anything: the
// result is the same bits whatever the SIMD width.
constexpr int kLanes = 16;

struct RowScan {
  float max = 0;         // largest logit (finite)
  float min_finite = 0;  // smallest finite logit
  int32_t argmax = 0;    // lowest id holding max
};

RowScan scan(const float* l, int64_t vocab) {
  float mx[kLanes], mn[kLanes];
  int32_t bad[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    mx[j] = -INFINITY;
    mn[j] = INFINITY;
    bad[j] = 0;
  }
  auto step = [&](int j, float x) {
    mx[j] = x > mx[j] ? x : mx[j];
    mn[j] = (x < mn[j] && x > -INFINITY) ? x : mn[j];
    bad[j] |= (x != x) | (x == INFINITY);
  };
  int64_t i = 0;
  for (; i + kLanes <= vocab; i += kLanes)
    for (int j = 0; j < kLanes; ++j) step(j, l[i + j]);
  for (int j = 0; i < vocab; ++i, ++j) step(j, l[i]);
  RowScan s;
  s.max = -INFINITY;
  s.min_finite = INFINITY;
  int32_t any_bad = 0;
  for (int j = 0; j < kLanes; ++j) {
    s.max = std::max(s.max, mx[j]);
    s.min_finite = std::min(s.min_finite, mn[j]);
    any_bad |= bad[j];
  }
  if (any_bad) throw std::runtime_error("sampler: logits contain NaN or +inf (the forward pass diverged)");
  if (s.max == -INFINITY) throw std::runtime_error("sampler: every logit is -inf, nothing can be sampled");
  while (l[s.argmax] != s.max) ++s.argmax;
  return s;
}

double sum(const float* x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += x[i];
  double total = 0;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  return total;
}

// The n best ids in rank order (n <= vocab).
void top_ids(const float* l, int64_t vocab, int64_t n, std::vector<int32_t>& out) {
  const RanksBefore before{l};
  out.clear();
  if (n <= 0) return;
  if (n <= 256) {
    // Bounded heap whose front is the worst kept id: one pass; after the
    // first few thousand ids nearly all are rejected by one comparison.
    out.reserve(n);
    int32_t i = 0;
    for (; i < n; ++i) out.push_back(i);
    std::make_heap(out.begin(), out.end(), before);
    float worst = l[out.front()];
    for (; i < vocab; ++i) {
      if (l[i] < worst || !before(i, out.front())) continue;
      std::pop_heap(out.begin(), out.end(), before);
      out.back() = i;
      std::push_heap(out.begin(), out.end(), before);
      worst = l[out.front()];
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

// Lowest index holding the largest of x[0, n) (n >= 1, no NaN).
int64_t first_max(const float* x, int64_t n) {
  float mx[kLanes];
  for (int j = 0; j < kLanes; ++j) mx[j] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) mx[j] = x[i + j] > mx[j] ? x[i + j] : mx[j];
  for (int j = 0; i < n; ++i, ++j) mx[j] = x[i] > mx[j] ? x[i] : mx[j];
  float best = -INFINITY;
  for (int j = 0; j < kLanes; ++j) best = std::max(best, mx[j]);
  int64_t at = 0;
  while (x[at] != best) ++at;
  return at;
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
  std::vector<float> w;         // weight of each id (meaningful for kept ids)
  std::vector<int32_t> key;     // bucket of each id
  std::vector<double> mass;     // per bucket
  std::vector<double> partial;  // 4 interleaved histograms of the masses
  std::vector<int32_t> members; // ids of bucket `gathered`, in rank order
  int gathered = -1;
  int last_positive = -1;       // last bucket with mass > 0
  std::vector<float> kept_logits, kept_weights;  // logits and weights of `members`
  std::vector<float> score;     // perturbed scores
  std::vector<float> saved;     // scores of the cut bucket's kept members
};

void gather(Scratch& sc, int b, int64_t vocab, const RanksBefore& before) {
  if (sc.gathered == b) return;
  // Branch-free compaction: most ids are not in the bucket.
  sc.members.resize(vocab + 1);
  int32_t* out = sc.members.data();
  const int32_t* key = sc.key.data();
  int64_t n = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    out[n] = i;
    n += key[i] == b;
  }
  sc.members.resize(n);
  std::sort(sc.members.begin(), sc.members.end(), before);
  sc.gathered = b;
}

// The last kept id of a nucleus: `index` in the rank order of bucket `bucket`
// (whose ids are then gathered in sc.members).
struct Crossing {
  int bucket = -1;
  int64_t index = -1;
};

// First id (in rank order) at which the cumulative weight reaches
// top_p * total, skipping zero weights; when rounding leaves it unreached,
// the last id of positive weight.
Crossing nucleus_cut(Scratch& sc, int64_t vocab, const RanksBefore& before, float top_p) {
  // The best id has weight exactly 1, so the total is >= 1 and the walk
  // always finds an id.
  double total = 0;
  for (int b = 0; b <= sc.last_positive; ++b) total += sc.mass[b];
  const double t = static_cast<double>(top_p) * total;
  double cum = 0;
  Crossing last;
  for (int b = 0; b <= sc.last_positive; ++b) {
    const double m = sc.mass[b];
    if (m == 0) continue;
    if (cum + m >= t || b == sc.last_positive) {
      gather(sc, b, vocab, before);
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

// Every id of the row, weighted, in kBuckets buckets spread linearly over the
// logit range that carries weight (below max - 87 T the weights are 0).
void bucket_all(const float* l, int64_t vocab, const RowScan& s, float inv_t, Scratch& sc) {
  sc.w.resize(vocab);
  sc.key.resize(vocab);
  exp_shifted(l, vocab, s.max, inv_t, sc.w.data());
  const float range = std::min(s.max - s.min_finite, 87.0f / inv_t);
  const float scale = range > 0 ? static_cast<float>(kBuckets) / range : 0.0f;
  int32_t* key = sc.key.data();
  for (int64_t i = 0; i < vocab; ++i) {
    const float x = (s.max - l[i]) * scale;  // NaN (inf * 0) and inf land in the last bucket
    key[i] = x < kBuckets - 1 ? static_cast<int32_t>(x) : kBuckets - 1;
  }
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
}

// The top_k ids as one bucket, already in rank order, with their logits and
// weights.
void bucket_top_k(const float* l, int64_t vocab, int64_t k, const RowScan& s, float inv_t,
                  Scratch& sc) {
  top_ids(l, vocab, k, sc.members);
  sc.w.resize(vocab);
  sc.kept_logits.resize(k);
  sc.kept_weights.resize(k);
  for (int64_t j = 0; j < k; ++j) sc.kept_logits[j] = l[sc.members[j]];
  exp_shifted(sc.kept_logits.data(), k, s.max, inv_t, sc.kept_weights.data());
  double m = 0;
  for (int64_t j = 0; j < k; ++j) {
    sc.w[sc.members[j]] = sc.kept_weights[j];
    m += sc.kept_weights[j];
  }
  sc.mass.assign(1, m);
  sc.gathered = 0;
  sc.last_positive = m > 0 ? 0 : -1;
}

// Gumbel-max over the ids ids[0, n) with logits x[0, n): highest perturbed
// score, lowest id on an exact tie.
int32_t best_of(const float* x, const int32_t* ids, int64_t n, float shift, float inv_t, uint64_t key,
                Scratch& sc) {
  if (n == 1) return ids[0];
  sc.score.resize(n);
  perturbed_scores(x, ids, n, shift, inv_t, key, sc.score.data());
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j) {
    const float a = sc.score[j], b = sc.score[best];
    if (a > b || (a == b && ids[j] < ids[best])) best = j;
  }
  return ids[best];
}

int32_t draw(const float* l, int64_t vocab, const SamplingParams& p, int64_t position,
             const RowScan& s) {
  thread_local Scratch sc;
  const float inv_t = 1.0f / p.temperature;
  const uint64_t key = row_key(p.seed, position);
  const bool nucleus = p.top_p < 1.0f;
  if (p.top_k > 0 && p.top_k < vocab) {
    bucket_top_k(l, vocab, p.top_k, s, inv_t, sc);
    const int64_t kept = nucleus ? nucleus_cut(sc, vocab, RanksBefore{l}, p.top_p).index + 1 : p.top_k;
    return best_of(sc.kept_logits.data(), sc.members.data(), kept, s.max, inv_t, key, sc);
  }
  sc.score.resize(vocab);
  float* score = sc.score.data();
  if (!nucleus) {
    perturbed_scores(l, nullptr, vocab, s.max, inv_t, key, score);
    return static_cast<int32_t>(first_max(score, vocab));
  }
  bucket_all(l, vocab, s, inv_t, sc);
  const Crossing cut = nucleus_cut(sc, vocab, RanksBefore{l}, p.top_p);
  // Kept: every id of the buckets before the cut's, and the cut bucket's
  // members up to the cut.
  const int64_t head = cut.index + 1;
  if (cut.bucket == 0) {
    sc.kept_logits.resize(head);
    for (int64_t j = 0; j < head; ++j) sc.kept_logits[j] = l[sc.members[j]];
    return best_of(sc.kept_logits.data(), sc.members.data(), head, s.max, inv_t, key, sc);
  }
  perturbed_scores(l, nullptr, vocab, s.max, inv_t, key, score);
  sc.saved.resize(head);
  for (int64_t j = 0; j < head; ++j) sc.saved[j] = score[sc.members[j]];
  const int32_t* bucket = sc.key.data();
  for (int64_t i = 0; i < vocab; ++i) score[i] = bucket[i] < cut.bucket ? score[i] : -INFINITY;
  for (int64_t j = 0; j < head; ++j) score[sc.members[j]] = sc.saved[j];
  return static_cast<int32_t>(first_max(score, vocab));
}

void fill_logprobs(const float* l, int64_t vocab, const RowScan& s, int32_t k, SampledToken& out) {
  thread_local std::vector<float> e;
  thread_local std::vector<int32_t> ids;
  e.resize(vocab);
  exp_shifted(l, vocab, s.max, 1.0f, e.data());
  const double lse = static_cast<double>(s.max) + std::log(sum(e.data(), vocab));
  out.logprob = static_cast<float>(l[out.id] - lse);
  top_ids(l, vocab, std::min<int64_t>(k, vocab), ids);
  out.top.clear();
  out.top.reserve(ids.size());
  for (int32_t id : ids) out.top.emplace_back(id, static_cast<float>(l[id] - lse));
}

}  // namespace

float gumbel_noise(uint64_t seed, int64_t position, int32_t token) {
  return token_gumbel(row_key(seed, position), token);
}

SampledToken sample(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position) {
  validate(p);
  if (vocab < 1) throw std::invalid_argument("sampling: vocab must be >= 1, got " + std::to_string(vocab));
  const RowScan s = scan(logits, vocab);
  SampledToken out;
  // A temperature so small that 1/T overflows is greedy in all but name.
  const bool greedy = p.temperature == 0.0f || !std::isfinite(1.0f / p.temperature);
  out.id = greedy ? s.argmax : draw(logits, vocab, p, position, s);
  if (p.logprobs >= 0) fill_logprobs(logits, vocab, s, p.logprobs, out);
  return out;
}

std::vector<SampledToken> sample_rows(const at::Tensor& logits, const std::vector<SamplingParams>& params,
                                      const std::vector<int64_t>& positions) {
  if (logits.dim() != 2 || !at::isFloatingType(logits.scalar_type()))
    throw std::invalid_argument("sample_rows: logits must be a floating [rows, vocab] tensor, got " +
                                std::to_string(logits.dim()) + " dims");
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  if (static_cast<int64_t>(params.size()) != rows || static_cast<int64_t>(positions.size()) != rows)
    throw std::invalid_argument("sample_rows: " + std::to_string(rows) + " logit rows but " +
                                std::to_string(params.size()) + " params and " +
                                std::to_string(positions.size()) + " positions");
  for (const auto& p : params) validate(p);
  std::vector<SampledToken> out(rows);
  if (rows == 0) return out;
  const at::Tensor cpu = logits.to(at::kCPU, at::kFloat).contiguous();
  const float* base = cpu.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) out[r] = sample(base + r * vocab, vocab, params[r], positions[r]);
  });
  return out;
}

}  // namespace troupe::model
