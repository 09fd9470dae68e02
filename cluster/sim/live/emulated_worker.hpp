#pragma once
// An emulated worker (`troupe worker --emulate cost.json`): the whole worker
// protocol — registration, heartbeats, step plans checked and applied to a
// real core::SequenceTable (KV accounting included) — without a model. Each
// step takes the time the cost model predicts for it (a sleep), and the
// tokens are a deterministic function of (sequence, position) that is never
// eos, so outputs have the forced lengths. One machine can then run a head and
// dozens of such workers and load the real router, batcher and ZeroMQ path.
#include <cstdint>

#include "actors/worker_actor.hpp"
#include "cluster/sim/cost_model.hpp"
#include "core/sequence_table.hpp"

namespace troupe::cluster {

struct EmulatedWorkerConfig {
  sim::CostModel cost;                // predicts each step's time
  core::SequenceTableOptions table;   // the pool and model facts it reports
  int32_t eos_id = -1;                // never returned as a token; -1 = none
  double time_scale = 1.0;            // multiplies the predicted times (> 0)
};

actors::StepRunner make_emulated_runner(const EmulatedWorkerConfig& config);

// The token an emulated worker samples at `position` of sequence `seq_id`.
int32_t emulated_token(uint64_t seq_id, int32_t position, int32_t vocab_size, int32_t eos_id);

}  // namespace troupe::cluster
