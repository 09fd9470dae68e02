#include "cluster/sim/roofline.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <yaml-cpp/yaml.h>

#include "cluster/sim/random.hpp"
#include "core/serving_metrics.hpp"

namespace troupe::cluster::sim {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw std::runtime_error("roofline spec " + path + ": " + what);
}

double number(const YAML::Node& root, const std::string& path, const char* key, double lo, double hi,
              bool required = true, double fallback = 0) {
  const YAML::Node n = root[key];
  if (!n) {
    if (required) bad(path, std::string("'") + key + "' is missing");
    return fallback;
  }
  double v = 0;
  try {
    v = n.as<double>();
  } catch (const YAML::Exception&) {
    bad(path, std::string("'") + key + "' must be a number");
  }
  if (!std::isfinite(v) || v < lo || v > hi)
    bad(path, std::string("'") + key + "' = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
  return v;
}

bool is_int8(const std::string& dtype) { return dtype == "int8" || dtype == "int8_g32"; }

// Bytes of one stored activation or K/V value.
double value_bytes(const std::string& dtype) {
  if (dtype == "float32") return 4;
  if (dtype == "bfloat16" || is_int8(dtype)) return 2;
  throw std::invalid_argument("roofline: dtype '" + dtype + "': expected float32, bfloat16, int8 or int8_g32");
}

// Bytes per weight of a matrix [K inputs, N outputs]: its values and scales.
double matrix_weight_bytes(const std::string& dtype, double K) {
  if (dtype == "int8") return 1 + 4 / K;  // an fp32 scale per output channel
  if (dtype == "int8_g32") return 1 + 4.0 / 32;
  return value_bytes(dtype);
}

// The spec's peak for the weight matrices' products, and for the rest (attention), TFLOP/s.
double matrix_peak(const RooflineSpec& s, const std::string& dtype) {
  return is_int8(dtype) ? s.int8_tops : dtype == "bfloat16" ? s.bf16_tflops : s.fp32_tflops;
}
double other_peak(const RooflineSpec& s, const std::string& dtype) {
  return dtype == "float32" ? s.fp32_tflops : s.bf16_tflops;
}

// Queries of a prefill chunk that share one read of its keys and values (a
// FlashAttention-style tile; troupe's CPU kernel tiles 16).
constexpr double kQueryTile = 64;
// Values per token per layer that pass through memory between operations:
// x and its LayerNorm twice (4E), q/k/v (3E), the attention output (E), the
// MLP's 4E in and out of GELU (8E), the two residual adds (2E): ~18E.
constexpr double kActivationValues = 18;

void add_point(std::vector<MeasuredStep>& out, const StepShape& shape, double ns, int32_t prefill_tokens,
               int32_t prefill_seqs, int32_t decode_seqs, int64_t decode_context) {
  MeasuredStep m;
  m.sample.shape = shape;
  m.sample.ns = ns;
  m.reps_ns = {ns};
  m.prefill_tokens = prefill_tokens;
  m.prefill_seqs = prefill_seqs;
  m.decode_seqs = decode_seqs;
  m.decode_context = decode_context;
  out.push_back(std::move(m));
}

}  // namespace

RooflineSpec read_roofline_spec(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    bad(path, std::string("cannot read it: ") + e.what());
  }
  if (!root.IsMap()) bad(path, "expected a map of fields");
  static const std::set<std::string> keys = {"name",         "kind",
                                             "fp32_tflops",  "bf16_tflops", "int8_tops",
                                             "memory_gbs",   "compute_efficiency",
                                             "bandwidth_efficiency", "step_overhead_us", "layer_overhead_us",
                                             "sources",      "notes"};
  for (const auto& kv : root) {
    const std::string k = kv.first.as<std::string>();
    if (!keys.count(k)) bad(path, "unknown field '" + k + "'");
  }
  RooflineSpec s;
  if (!root["name"]) bad(path, "'name' is missing");
  s.name = root["name"].as<std::string>();
  if (root["kind"]) s.kind = root["kind"].as<std::string>();
  if (s.kind != "gpu" && s.kind != "cpu") bad(path, "'kind' must be gpu or cpu");
  s.fp32_tflops = number(root, path, "fp32_tflops", 0, 1e6);
  s.bf16_tflops = number(root, path, "bf16_tflops", 0, 1e6, false, 0);
  s.int8_tops = number(root, path, "int8_tops", 0, 1e6, false, 0);
  s.memory_gbs = number(root, path, "memory_gbs", 1e-3, 1e7);
  s.compute_efficiency = number(root, path, "compute_efficiency", 1e-3, 1);
  s.bandwidth_efficiency = number(root, path, "bandwidth_efficiency", 1e-3, 1);
  s.step_overhead_us = number(root, path, "step_overhead_us", 0, 1e6, false, 0);
  s.layer_overhead_us = number(root, path, "layer_overhead_us", 0, 1e6, false, 0);
  if (s.fp32_tflops <= 0) bad(path, "'fp32_tflops' must be > 0");
  if (!root["sources"] || !root["sources"].IsSequence() || root["sources"].size() == 0)
    bad(path, "'sources' must list where the numbers come from");
  for (const auto& n : root["sources"]) s.sources.push_back(n.as<std::string>());
  if (root["notes"]) s.notes = root["notes"].as<std::string>();
  return s;
}

StepWork roofline_work(const ModelShape& m, const std::string& dtype, const StepShape& shape,
                       const std::string& kv_dtype) {
  const double b = value_bytes(dtype);
  const double kv_b = value_bytes(kv_dtype.empty() ? roofline_kv_dtype(dtype) : kv_dtype);
  const double E = m.n_embd, L = m.n_layer, V = m.vocab_size, P = m.n_positions;
  const double T = static_cast<double>(shape.tokens), S = shape.sample_rows;
  const double pairs = static_cast<double>(shape.decode_pairs + shape.prefill_pairs);
  StepWork w;
  // The four matrices per layer (12E^2 per token), the LM head per sampled
  // row, q.k and p.v per query-key pair and layer (2E each).
  w.matrix_flops = 2.0 * 12 * E * E * L * T + 2.0 * E * V * S;
  w.flops = w.matrix_flops + 4.0 * E * L * pairs;
  // Matrices (c_attn, c_proj: E inputs; c_fc: E; its projection: 4E) and the
  // tied wte (E inputs a row) in the weights' dtype; biases, norms and wpe as values.
  const double weights = (8 * E * E * matrix_weight_bytes(dtype, E) + 4 * E * E * matrix_weight_bytes(dtype, 4 * E)) * L +
                         V * E * matrix_weight_bytes(dtype, E) + (13 * E * L + P * E) * b;
  const double kv_per_token = 2 * E * L * kv_b;
  const double kv_read = static_cast<double>(shape.decode_pairs) * kv_per_token +
                         static_cast<double>(shape.prefill_pairs) / kQueryTile * kv_per_token;
  w.bytes = weights + kv_read + T * kv_per_token /* written */ + T * kActivationValues * E * L * b +
            S * V * 4 /* fp32 logits */;
  return w;
}

std::string roofline_kv_dtype(const std::string& dtype) {
  value_bytes(dtype);  // names an unknown dtype
  return dtype == "float32" ? "float32" : "bfloat16";
}

double roofline_ns(const RooflineSpec& s, const ModelShape& m, const std::string& dtype, const StepShape& shape,
                   const std::string& kv_dtype) {
  const double matrix_tflops = matrix_peak(s, dtype), other_tflops = other_peak(s, dtype);
  if (matrix_tflops <= 0 || other_tflops <= 0)
    throw std::invalid_argument("roofline: " + s.name + " has no " +
                                (is_int8(dtype) && matrix_tflops <= 0 ? std::string("int8") : roofline_kv_dtype(dtype)) +
                                " peak in its spec");
  if (shape.tokens <= 0) return 0;
  const StepWork w = roofline_work(m, dtype, shape, kv_dtype);
  const double compute_ns = (w.matrix_flops / matrix_tflops + (w.flops - w.matrix_flops) / other_tflops) /
                            (1e12 * s.compute_efficiency) * 1e9;
  const double memory_ns = w.bytes / (s.memory_gbs * 1e9 * s.bandwidth_efficiency) * 1e9;
  return std::max(compute_ns, memory_ns) + (s.step_overhead_us + s.layer_overhead_us * m.n_layer) * 1e3;
}

namespace {

ModelShape gpt2_of(const std::string& size) {
  ModelShape m;  // 124M
  if (size == "355M") {
    m.n_layer = 24, m.n_head = 16, m.n_embd = 1024;
  } else if (size == "774M") {
    m.n_layer = 36, m.n_head = 20, m.n_embd = 1280;
  } else if (size == "1.5B") {
    m.n_layer = 48, m.n_head = 25, m.n_embd = 1600;
  } else if (size != "124M") {
    throw std::invalid_argument("model '" + size + "'");
  }
  return m;
}

}  // namespace

std::vector<RooflineError> roofline_errors(const RooflineSpec& spec, const std::vector<MeasuredShape>& steps) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by;  // class -> (abs, signed)
  for (const MeasuredShape& s : steps) {
    if (s.ns <= 0) continue;
    const double e = (roofline_ns(spec, s.model, s.dtype, s.shape, s.kv_dtype) - s.ns) / s.ns * 100;
    for (const std::string& c : {s.step_class, std::string("all")}) {
      by[c].first.push_back(std::fabs(e));
      by[c].second.push_back(e);
    }
  }
  std::vector<RooflineError> out;
  for (auto& [c, v] : by)
    out.push_back({c, v.first.size(), core::percentile(v.first, 50), core::percentile(v.first, 90),
                   core::percentile(v.second, 50)});
  return out;
}

std::vector<MeasuredShape> measured_steps(const CostProfile& p) {
  std::vector<MeasuredShape> out;
  for (const auto* set : {&p.fit_points, &p.heldout_points}) {
    for (const MeasuredStep& m : *set) {
      const bool pre = m.prefill_seqs > 0, dec = m.decode_seqs > 0;
      out.push_back({pre && dec ? "mixed" : pre ? "prefill" : "decode", p.model, p.dtype, p.kv_cache_dtype,
                     m.sample.shape, m.sample.ns});
    }
  }
  return out;
}

std::vector<MeasuredShape> measured_steps_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> head;
  {
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, ',');) head.push_back(f);
  }
  auto col = [&](const char* name) -> size_t {
    const auto it = std::find(head.begin(), head.end(), name);
    if (it == head.end()) throw std::runtime_error(path + ": no column '" + name + "'");
    return static_cast<size_t>(it - head.begin());
  };
  const size_t c_model = col("model"), c_dtype = col("dtype"), c_kind = col("kind"), c_batch = col("batch"),
               c_tokens = col("tokens"), c_ctx = col("context"), c_graph = col("graph"), c_ms = col("median_ms");
  std::vector<MeasuredShape> out;
  for (int n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    try {
      if (f.size() < head.size()) throw std::invalid_argument("too few fields");
      MeasuredShape m;
      m.model = gpt2_of(f[c_model]);
      m.dtype = f[c_dtype];
      const int32_t batch = std::stoi(f[c_batch]), tokens = std::stoi(f[c_tokens]), ctx = std::stoi(f[c_ctx]);
      const std::string kind = f[c_kind];
      if (kind == "decode") {
        for (int32_t i = 0; i < batch; ++i) m.shape.add(ctx, 1, true);
      } else if (kind == "prefill") {
        for (int32_t i = 0; i < batch; ++i) m.shape.add(0, tokens / batch, true);
      } else if (kind == "mixed") {  // batch - 1 decodes at the context, one chunk of the other tokens
        for (int32_t i = 0; i + 1 < batch; ++i) m.shape.add(ctx, 1, true);
        m.shape.add(0, tokens - (batch - 1), true);
      } else {
        throw std::invalid_argument("kind '" + kind + "'");
      }
      m.step_class = kind + (f[c_graph] == "1" ? " (CUDA graph)" : " (eager)");
      m.ns = std::stod(f[c_ms]) * 1e6;
      out.push_back(std::move(m));
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(n) + ": " + e.what());
    }
  }
  return out;
}

CostProfile roofline_profile(const RooflineSpec& s, const ModelShape& m, const std::string& dtype,
                             int32_t block_size, uint64_t seed, const std::string& kv_dtype_in) {
  const std::string kv_dtype = kv_dtype_in.empty() ? roofline_kv_dtype(dtype) : kv_dtype_in;
  if (block_size < 1) throw std::invalid_argument("roofline: block_size must be >= 1");
  CostProfile p;
  const int32_t max_tokens = 2048, max_ctx = m.n_positions;
  auto time = [&](const StepShape& sh) { return roofline_ns(s, m, dtype, sh, kv_dtype); };
  // Prefill chunks from the start and after a cached prefix.
  for (int32_t n = 1; n <= std::min(max_tokens, max_ctx); n *= 2) {
    for (int32_t start : {0, max_ctx / 2}) {
      if (start + n > max_ctx) continue;
      StepShape sh;
      sh.add(start, n, true);
      add_point(p.fit_points, sh, time(sh), n, 1, 0, 0);
    }
  }
  // Decode batches at several contexts, alone and with a prefill chunk.
  for (int32_t seqs = 1; seqs <= 256; seqs *= 2) {
    for (int32_t ctx : {32, 128, 512, max_ctx - 1}) {
      for (int32_t chunk : {0, 256}) {
        StepShape sh;
        for (int32_t i = 0; i < seqs; ++i) sh.add(ctx, 1, true);
        if (chunk > 0) sh.add(0, chunk, true);
        add_point(p.fit_points, sh, time(sh), chunk, chunk > 0, seqs, int64_t{seqs} * ctx);
      }
    }
  }
  // Held out: random mixes.
  Random rng(seed ^ 0x0f1e);
  for (int i = 0; i < 40; ++i) {
    StepShape sh;
    const int32_t seqs = static_cast<int32_t>(rng.uniform_int(0, 128));
    int64_t context = 0;
    for (int32_t k = 0; k < seqs; ++k) {
      const int32_t ctx = static_cast<int32_t>(rng.uniform_int(1, max_ctx - 1));
      sh.add(ctx, 1, true);
      context += ctx;
    }
    int32_t chunk = 0;
    if (seqs == 0 || rng.uniform() < 0.5) {
      chunk = static_cast<int32_t>(rng.uniform_int(1, 1024));
      sh.add(0, chunk, true);
    }
    add_point(p.heldout_points, sh, time(sh), chunk, chunk > 0, seqs, context);
  }
  refit(p, RepStat::kMin);
  p.device = s.kind == "gpu" ? "roofline-gpu" : "roofline-cpu";
  p.dtype = dtype;
  p.kv_cache_dtype = kv_dtype;
  p.processor = s.name + " (roofline prediction, not a measurement)";
  p.threads = 0;
  char summary[256];
  std::snprintf(summary, sizeof summary,
                "roofline: %g TFLOP/s x %g, %g GB/s x %g, + %g us per step + %g us per layer",
                matrix_peak(s, dtype), s.compute_efficiency, s.memory_gbs,
                s.bandwidth_efficiency, s.step_overhead_us, s.layer_overhead_us);
  p.thread_summary = summary;
  p.libraries = {{"troupe_cost_model", std::to_string(CostProfile::kVersion)}, {"roofline", s.name}};
  p.model = m;
  p.block_size = block_size;
  p.kv_bytes_per_token = static_cast<int64_t>(2.0 * m.n_layer * m.n_embd * value_bytes(kv_dtype));
  p.sampling = "greedy";
  p.created = "roofline";
  return p;
}

}  // namespace troupe::cluster::sim
