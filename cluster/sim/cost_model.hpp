#pragma once
// CostModel: predicts how long a worker takes for one step, from the step's
// shape alone, so the simulator (and an emulated worker) can stand in for a
// real one. In the spirit of Vidur (Agrawal et al., MLSys 2024: profile the
// real operators, fit, predict any batch), with a few terms that follow the
// work a GPT-2 step does:
//
//   time = g(T)                  weights read once + per-token GEMM work; g is
//                                piecewise linear in the step's tokens T, so
//                                the change from memory-bound (few tokens) to
//                                compute-bound (many) is learnt, not assumed
//        + a_s * sample rows     LM head (n_embd x vocab per sampled row) + sampling
//        + a_d * decode pairs    attention reads of one-token items: their context
//        + a_p * prefill pairs   attention of multi-token chunks: query-key pairs
//        + a_q * items           per-sequence overhead (tables, gathers)
//
// fitted by non-negative least squares on relative error (each measured point
// weighs 1/time), so short and long steps count alike. Torch-free.
#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/step_plan.hpp"

namespace troupe::cluster::sim {

// What the cost model sees of a step.
struct StepShape {
  int64_t tokens = 0;         // tokens run: prompt chunks + decodes
  int32_t items = 0;          // work items (sequences in the step)
  int32_t sample_rows = 0;    // LM head rows: items that sample a token, prompt rows scored
  int64_t decode_pairs = 0;   // one-token items: sum of (start_pos + 1), the keys each query reads
  int64_t prefill_pairs = 0;  // multi-token items: sum of n * start_pos + n(n+1)/2 query-key pairs

  // Adds one work item: `n` tokens from position `start`.
  void add(int32_t start, int32_t n, bool sample);
  static StepShape of(const core::StepPlan& plan);
};

struct CostSample {
  StepShape shape;
  double ns = 0;  // measured step time
};

class CostModel {
 public:
  std::vector<double> knots;    // token counts where g is pinned; increasing, knots[0] >= 1
  std::vector<double> knot_ns;  // g at each knot
  double sample_ns = 0, decode_pair_ns = 0, prefill_pair_ns = 0, item_ns = 0;

  // The predicted step time, >= 1 ns (0 for an empty step). Below the first
  // knot g is flat; past the last it follows the last segment's slope.
  int64_t predict_ns(const StepShape& shape) const;
  int64_t predict_ns(const core::StepPlan& plan) const { return predict_ns(StepShape::of(plan)); }

  // The same model with every term times `factor` (finite, > 0): it predicts
  // factor x this one's time for every step (up to rounding to 1 ns). What
  // `troupe simulate --cost-scale` runs: a device that much slower (or
  // faster), or how far a cost model's error moves the simulated latencies.
  // Throws std::invalid_argument on a bad factor.
  CostModel scaled(double factor) const;

  // Fits every term to `samples` (non-empty, times > 0). `knots` as above.
  static CostModel fit(const std::vector<double>& knots, const std::vector<CostSample>& samples);
  // The knots a fit over steps of at most `largest` tokens uses: 1, the
  // powers of 4 below `largest`, and `largest`.
  static std::vector<double> knots_up_to(int64_t largest);

  nlohmann::json to_json() const;
  // Throws std::runtime_error naming the field on a malformed object.
  static CostModel from_json(const nlohmann::json& j);

 private:
  // The row of the fitting problem: hat-function weights of T, then the other terms.
  static std::vector<double> basis(const std::vector<double>& knots, const StepShape& shape);
  void check() const;
};

// Relative error |predicted - measured| / measured over samples, in percent.
struct FitError {
  size_t points = 0;
  double median_pct = 0, p90_pct = 0, max_pct = 0;
};
FitError fit_error(const CostModel& model, const std::vector<CostSample>& samples);

}  // namespace troupe::cluster::sim
