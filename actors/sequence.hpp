#pragma once
// The scheduler's state for one live request (internal to the Scheduler).
#include <cstdint>
#include <memory>
#include <vector>

#include "actors/output_text.hpp"
#include "actors/request.hpp"

namespace troupe::actors {

struct Sequence {
  enum class State { kWaiting, kRunning };

  Request request;              // prompt_ids moved out into `tokens`
  std::vector<int32_t> tokens;  // prompt, then generated ids
  int32_t num_prompt = 0;
  State state = State::kWaiting;
  uint64_t arrival = 0;         // submission order: the policy's tie-break

  // KV: tokens [0, num_computed) are in the cache; [num_computed,
  // num_computed + num_in_flight) are being computed by the step in flight.
  // A running sequence holds exactly ceil((num_computed + num_in_flight) / block_size)
  // blocks; a waiting one holds none.
  int32_t num_computed = 0;
  int32_t num_in_flight = 0;
  uint64_t in_flight_step = 0;
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;  // chained hashes of the full blocks of `tokens` (grows lazily)
  int32_t num_registered = 0;    // blocks [0, num_registered) were offered to the prefix cache

  int32_t plan_index = -1;       // chunk index in the plan being formed, -1 when absent
  bool finished = false;         // set in on_step_done just before removal
  bool admitted_once = false;
  int32_t cached_tokens = 0;     // prefix-cache hit at first admission (usage)
  std::unique_ptr<OutputText> text;  // null without a tokenizer

  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - num_prompt; }
  // Tokens not yet computed nor in flight: 1 for a decode, more mid-prefill.
  int32_t num_pending() const {
    return static_cast<int32_t>(tokens.size()) - num_computed - num_in_flight;
  }
};

}  // namespace troupe::actors
