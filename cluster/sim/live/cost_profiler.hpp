#pragma once
// The measuring half of `troupe profile`: times the real worker's step
// (model::StepExecutor::run, the forward pass and sampling of every step,
// on a real PagedKvCache) over a grid of synthetic steps, fits the simulator's
// CostModel (cluster/sim/cost_model.hpp) on the grid and measures its error on
// random steps held out of the fit.
//
// Grid: prefill tokens in the step (split into prompt chunks of at most half
// the context window, each sampling), decode sequences, and their context
// (every decode sequence the same length). Held-out steps mix several prompt
// chunks (some continuing a prompt, some not sampling) with decodes of
// differing contexts, as a busy scheduler forms them. Every sequence has
// blocks of its own, so attention reads as much memory as in service. Each
// pass times every point once, in a new shuffled order (interference on a
// shared machine spreads over many points' runs); a point's time is the
// minimum (default) or median of its runs.
#include <cstdint>
#include <functional>
#include <string>

#include <c10/core/Device.h>

#include "cluster/sim/cost_profile.hpp"
#include "model/gpt2.hpp"
#include "model/paged_kv_cache.hpp"

namespace troupe::cluster {

struct ProfileOptions {
  bool quick = false;              // a small grid and few repetitions (tests; < 1 min on the tiny model)
  int32_t reps = 0;                // timed runs per point; 0 = 5, quick 3
  int32_t heldout = 0;             // random held-out steps; 0 = 40, quick 8
  int32_t block_size = 16;         // KV block size; >= 1
  int64_t max_kv_tokens = 0;       // KV slots a step may fill; 0 = 32768, quick 4096
  int32_t max_batched_tokens = 0;  // largest step; 0 = 2048 (troupe batch's default), quick 256
  uint64_t seed = 0;               // tokens and held-out steps
  model::KvDtype kv_dtype = model::KvDtype::kFloat32;  // the KV cache's storage (--kv-cache-dtype)
  sim::RepStat stat = sim::RepStat::kMin;                   // a point's time: its fastest run, or the median
  std::function<void(size_t done, size_t total)> progress;  // after each point
};

// Measures `model` on its device. Throws std::invalid_argument on bad options.
sim::CostProfile profile_worker(const model::Gpt2& model, const ProfileOptions& options);

}  // namespace troupe::cluster
