#pragma once
// Roofline cost profiles: a worker class we cannot measure (a GPU), predicted
// from its published limits. A step's time is
//
//   max(FLOPs / (peak x compute_efficiency), bytes / (bandwidth x bandwidth_efficiency))
//     + step_overhead + layer_overhead x n_layer
//
// with the FLOPs and bytes counted from the step's shape (StepShape) and the
// model's: every weight read once per step, the K/V a decode reads, a
// prefill chunk's K/V read once per tile of queries, the K/V it writes, the
// activations between layers, the logits of the rows that sample. The
// profile is that function fitted into the simulator's CostModel over a grid
// of steps (prefill chunks, decode batches at several contexts, mixed), so
// it runs wherever a measured profile does; its held-out error says how well
// the fit follows the roofline (not how well the roofline follows the
// device: docs/simulation.md, "Roofline profiles"). These are predictions.
#include <string>
#include <vector>

#include "cluster/sim/cost_model.hpp"
#include "cluster/sim/cost_profile.hpp"

namespace troupe::cluster::sim {

struct RooflineSpec {
  std::string name;                // "NVIDIA H100 SXM"
  std::string kind = "gpu";        // "gpu" or "cpu" (reports)
  double fp32_tflops = 0;          // dense peak, no sparsity, by dtype of the matrix products
  double bf16_tflops = 0;          // (0 = the device has no such path: the dtype is refused)
  double int8_tops = 0;            // int8 x int8 -> int32 products (tensor cores, VNNI), dense
  double memory_gbs = 0;           // memory bandwidth, GB/s
  double compute_efficiency = 0;   // achievable share of the peak in a serving step's GEMMs, (0, 1]
  double bandwidth_efficiency = 0; // achievable share of the bandwidth streaming weights and K/V, (0, 1]
  double step_overhead_us = 0;     // fixed per step (synchronisation, host), >= 0
  double layer_overhead_us = 0;    // per layer per step (its chain of small kernels' launches and tails), >= 0
  std::vector<std::string> sources;  // where each number comes from
  std::string notes;
};

// Reads a spec (YAML; JSON is YAML too). Throws std::runtime_error naming
// the file and field on a missing file, a missing or out-of-range field.
RooflineSpec read_roofline_spec(const std::string& path);

// What one step does.
struct StepWork {
  double flops = 0;         // multiply-add = 2
  double matrix_flops = 0;  // of which the weight matrices' (the four per block and the LM head)
  double bytes = 0;         // read and written in memory
};
// dtype: "float32" or "bfloat16" (weights, K/V and activations stored so), or
// "int8" / "int8_g32": int8 weight matrices (a scale per output channel, or
// per group of 32 inputs: 1.125 bytes a weight) multiplied as int8 x int8
// (activations quantized per row on the fly, W8A8: the peak is int8_tops),
// with K/V, activations and attention in bfloat16.
// kv_dtype: the K/V's storage, "float32" or "bfloat16"; empty = roofline_kv_dtype(dtype).
StepWork roofline_work(const ModelShape& model, const std::string& dtype, const StepShape& shape,
                       const std::string& kv_dtype = "");
// The dtype the roofline keeps K/V in unless told (the weights', bfloat16 for the int8 kinds).
std::string roofline_kv_dtype(const std::string& dtype);
// The roofline's time for that step, ns. Throws std::invalid_argument for a
// dtype the spec has no peak for.
double roofline_ns(const RooflineSpec& spec, const ModelShape& model, const std::string& dtype,
                   const StepShape& shape, const std::string& kv_dtype = "");

// The roofline against measured steps, per class of step.
struct MeasuredShape {
  std::string step_class;  // "prefill", "decode", "mixed" (a CSV may add how it ran: "decode, CUDA graph")
  ModelShape model;
  std::string dtype;
  std::string kv_dtype;  // empty: roofline_kv_dtype(dtype)
  StepShape shape;
  double ns = 0;  // measured
};
struct RooflineError {
  std::string step_class;
  size_t points = 0;
  double median_pct = 0, p90_pct = 0;  // |predicted - measured| / measured
  double median_signed_pct = 0;        // (predicted - measured) / measured: < 0 = the roofline is optimistic
};
std::vector<RooflineError> roofline_errors(const RooflineSpec& spec, const std::vector<MeasuredShape>& steps);
// A cost profile's measured points (fit and held out), classed by their grid coordinates.
std::vector<MeasuredShape> measured_steps(const CostProfile& profile);
// bench/gpu/gpt2_steps.py's CSV (model,dtype,kind,batch,tokens,context,graph,median_ms,...): GPT-2
// 124M/355M/774M/1.5B steps measured on a GPU. std::runtime_error naming the file and line on a bad row.
std::vector<MeasuredShape> measured_steps_csv(const std::string& path);

// The spec as a cost profile for `model` in `dtype`: the roofline over the
// grid (fit points) and over seeded random steps (held out), fitted.
CostProfile roofline_profile(const RooflineSpec& spec, const ModelShape& model, const std::string& dtype,
                             int32_t block_size = 16, uint64_t seed = 1, const std::string& kv_dtype = "");

}  // namespace troupe::cluster::sim
