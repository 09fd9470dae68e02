#pragma once
// The sampler's per-token loops, one variant per instruction set
// (sampler_kernels_{avx512,avx2,portable}.cpp all compile
// sampler_kernels.inc with their own flags, and with -ffp-contract=off).
// Internal to model/: sampler.cpp holds the logic and calls these.
//
// Bits: every variant computes the same IEEE operations in the same order
// (no FMA contraction, no reassociation; sums keep a fixed number of
// independent lanes combined in a fixed order whatever the vector width), so all variants
// return the same bits for the same input.
#include <cstdint>

#include "model/cpu_features.hpp"

namespace troupe::model {

// Upper bound on the Gumbel noise (the largest value the 2^-31 grid can give
// is -log(2^-32) = 22.18): an id whose scaled logit plus this is below the
// best score found so far cannot win, so its noise is never computed.
constexpr float kGumbelNoiseMax = 22.25f;

// Lanes of scan's extremes (LogitScan::lane_max).
constexpr int kMaxLanes = 64;

struct LogitScan {
  float max = 0;         // largest logit
  float min_finite = 0;  // smallest logit > -inf (+inf when there is none)
  int32_t argmax = 0;    // lowest id holding max
  bool bad = false;      // some logit is NaN or +inf (then the rest is meaningless)
  // lane_max[j] = the largest logit at an id i with i % kMaxLanes == j (-inf
  // for a lane no id reaches): kMaxLanes values of distinct ids when n >=
  // kMaxLanes, so the r-th largest of them is at most the r-th largest logit.
  float lane_max[kMaxLanes] = {};
};

struct GumbelWinner {
  int64_t index = -1;     // winning position j in [0, n); -1 when no candidate
  float score = 0;        // its perturbed score
  int64_t evaluated = 0;  // noise values computed (work count: pruned ids cost none)
};

struct SamplerKernels {
  LogitScan (*scan)(const float* logits, int64_t n);
  // out[i] = exp((x[i] - shift) * scale) for (x[i] - shift) * scale in
  // [-87, 0], 0 below (Cephes expf polynomial, ~1 ulp).
  void (*exp_shifted)(const float* x, int64_t n, float shift, float scale, float* out);
  // Sum of x[0, n) in double.
  double (*sum)(const float* x, int64_t n);
  // In double, the sum of w[0, n) (*total: the same bits as sum(w, n)) and of
  // the w[i] whose id ranks before id j in x (x[i] > x[j], or equal with
  // i < j: *before). Requires no NaN in x.
  void (*sums_ranked_before)(const float* x, const float* w, int64_t n, int64_t j, double* total,
                             double* before);
  // key[i] = min(floor((max - logits[i]) * scale), buckets - 1) (NaN and
  // inf land in the last bucket).
  void (*bucket_keys)(const float* logits, int64_t n, float max, float scale, int32_t buckets, int32_t* key);
  // The Gumbel-max trick over positions j in [0, n): the candidate at j has
  // id ids[j] (j when ids is null) and score (x[j] - shift) * inv_t +
  // noise(key, id); when `allow` is non-null only ids with allow[id] <
  // allow_below are candidates. Returns the highest score, lowest id on a
  // tie. `start` (a candidate position, or -1) is scored first: the bound
  // that prunes the rest (kGumbelNoiseMax on the logits, and the hashed bits
  // of each block's ids against the noise they would need), so peaked and
  // flat rows both cost few noise evaluations. Requires shift >= every x[j]
  // (callers pass the row's max) and inv_t > 0.
  GumbelWinner (*gumbel_argmax)(const float* x, const int32_t* ids, int64_t n, float shift, float inv_t,
                                uint64_t key, const int32_t* allow, int32_t allow_below, int64_t start);
  // The Gumbel noise of token `id` in the row keyed `key` (the same value
  // gumbel_argmax adds).
  float (*noise)(uint64_t key, int32_t id);
  // The 32 random bits behind noise(key, id).
  uint32_t (*noise_bits)(uint64_t key, int32_t id);
  // The ids i in [0, n) with key[i] == b, ascending, written to out (room
  // for n); returns their count.
  int64_t (*collect)(const int32_t* key, int64_t n, int32_t b, int32_t* out);
  // The same for the ids with key[i] < b.
  int64_t (*collect_below)(const int32_t* key, int64_t n, int32_t b, int32_t* out);
  // The first i in [from, n) with x[i] >= bound; n when there is none.
  int64_t (*next_at_least)(const float* x, int64_t from, int64_t n, float bound);
};

// The variant's kernels (every CpuIsa has them).
const SamplerKernels& sampler_kernels(CpuIsa isa);

namespace avx512 {
extern const SamplerKernels kSamplerKernels;
}
namespace avx2 {
extern const SamplerKernels kSamplerKernels;
}
namespace portable {
extern const SamplerKernels kSamplerKernels;
}

}  // namespace troupe::model
