#pragma once
// CostProfile: a cost.json written by `troupe profile` and read by the
// simulator (and, later, an emulated worker). It names what was measured
// (device, CPU or GPU model, threads, model shape, library versions), holds
// every measured point, the fitted CostModel and its error on points held out
// of the fit. One file per (model, device, threads): another device is
// another file.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/sim/cost_model.hpp"

namespace troupe::cluster::sim {

// The model's shape, as far as serving needs it.
struct ModelShape {
  int32_t n_layer = 12, n_head = 12, n_embd = 768;
  int32_t n_positions = 1024;  // max_model_len of a worker serving it
  int32_t vocab_size = 50257;
  int32_t eos_token_id = 50256;
};

// One measured step: its shape, the grid coordinates that made it, every repetition.
struct MeasuredStep {
  CostSample sample;            // shape and the median of reps_ns
  std::vector<double> reps_ns;  // each timed repetition
  int32_t prefill_tokens = 0;   // grid coordinates (for people reading the file)
  int32_t prefill_seqs = 0;
  int32_t decode_seqs = 0;
  int64_t decode_context = 0;  // total context of the decode sequences
};

// Which statistic of a point's repetitions stands for its time.
enum class RepStat {
  kMin,     // the fastest run: the step without interference from other processes (default)
  kMedian,  // the typical run, interference included
};
// "min", "median"; std::invalid_argument otherwise.
RepStat parse_rep_stat(const std::string& text);
const char* to_string(RepStat stat);

struct CostProfile {
  static constexpr int kVersion = 1;
  std::string created;    // UTC ISO-8601 time of the measurement
  std::string device;     // "cpu", "cuda:0", ...
  std::string dtype = "float32";  // the weights' storage the steps ran with (--dtype, --quantization); one per dtype
  std::string kv_cache_dtype = "float32";  // the KV cache's (--kv-cache-dtype); kv_bytes_per_token follows it
  std::string processor;  // CPU model (/proc/cpuinfo) or GPU name
  int32_t threads = 0;    // intra-op threads used
  std::string thread_summary;
  std::map<std::string, std::string> libraries;  // "torch" -> version, "troupe" -> version, "compiler" -> ...
  ModelShape model;
  int32_t block_size = 16;         // KV block size the steps ran with
  int64_t kv_bytes_per_token = 0;  // KV memory per token slot (all layers, K and V)
  std::string sampling;            // the sampling the steps used ("greedy")
  RepStat stat = RepStat::kMin;    // how each point's time comes from its repetitions
  CostModel cost;
  std::vector<MeasuredStep> fit_points, heldout_points;
  FitError fit_error, heldout_error;
  // How well the machine repeats itself: each point's time from its even runs
  // against from its odd runs (the statistic above), relative difference over
  // every point. No model fits better than its measurements repeat. (Needs 2 runs.)
  FitError repeatability;
  // Set by calibrate(): the served steps it used and the model's error on
  // them before and after (steps == 0: not calibrated; `cost` is then the
  // grid's fit). fit_error and heldout_error above follow the calibrated model.
  struct Calibration {
    size_t steps = 0;
    std::string source;
    FitError before, after;
  } calibration;

  nlohmann::ordered_json to_json() const;
  static CostProfile from_json(const nlohmann::json& j);  // std::runtime_error naming the field
};

// Sets every point's time from its repetitions by `stat`, fits the cost model
// on the fit points (knots at 1, powers of 4 and the largest step) and
// measures its error on both sets. Throws std::invalid_argument without fit
// points or repetitions.
void refit(CostProfile& profile, RepStat stat);

// Served steps from a step log (`troupe serve --step-log`, core/step_log.hpp):
// each line's shape and time. std::runtime_error naming the file and line on
// a malformed line; an empty file gives none.
std::vector<CostSample> read_step_log(const std::string& path);

// Calibrates the cost model to served steps: fits it again (same knots, same
// weighting) on the grid's points and the served steps together, so that it
// predicts steps as a served worker runs them -- in succession, as the
// scheduler forms them, on a worker that may have been idle -- where the
// served steps are, and as the grid measured them elsewhere (the largest
// steps, long contexts); a profile without measured points, on the served
// steps alone. The fit is then scaled so that its total over the served
// steps is theirs (the relative-error fit follows the typical step and
// misses the slow tail that a run's busy time includes). Replaces an
// earlier calibration; refit() clears it. std::invalid_argument with fewer
// than 10 served steps or one without tokens or time.
void calibrate(CostProfile& profile, const std::vector<CostSample>& served, const std::string& source);

void write_cost_profile(const std::string& path, const CostProfile& profile);
// Throws std::runtime_error naming the file on a missing, unreadable or malformed file.
CostProfile read_cost_profile(const std::string& path);

}  // namespace troupe::cluster::sim
