#pragma once
// The scheduler's state for one live request (internal to the Scheduler).
#include <cstdint>
#include <vector>

#include "core/request.hpp"

namespace troupe::core {

// One step in flight that runs part of a sequence.
struct InFlight {
  uint64_t step_id = 0;
  int32_t num_tokens = 0;
  bool sample = false;  // the step samples this sequence's next token (unknown until the result)
};

struct Sequence {
  enum class State { kWaiting, kRunning };

  Request request;              // prompt_ids and output_ids moved out into `tokens`
  std::vector<int32_t> tokens;  // prompt, then generated ids received so far
  int32_t num_prompt = 0;
  State state = State::kWaiting;
  uint64_t arrival = 0;  // submission order: the policy's tie-break

  // KV: tokens [0, num_computed) are in the cache; the steps in `in_flight`
  // (oldest first, at most max_steps_in_flight, one of them possibly the plan
  // being formed) compute the next ones. A sampling step adds a token the
  // worker knows before we do: decodes of it can be planned before its
  // result arrives (the worker feeds its own sample). A running sequence holds
  // exactly ceil(num_scheduled() / block_size) blocks; a waiting one none.
  int32_t num_computed = 0;
  std::vector<InFlight> in_flight;
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;  // chained names of the full blocks of `tokens` (grows lazily)
  int32_t num_registered = 0;    // blocks [0, num_registered) were offered to the prefix cache

  // The worker's copy: it holds the sequence (sent as a NewSequence, not
  // dropped since) and blocks [0, blocks_sent) of its table.
  bool known_to_worker = false;
  int32_t blocks_sent = 0;

  int32_t plan_index = -1;  // work item in the plan being formed, -1 when absent
  bool finished = false;    // set just before removal
  bool admitted_once = false;
  int32_t cached_tokens = 0;  // prefix-cache hit at first admission (usage)
  int32_t failures = 0;       // failed steps survived (the next one ends the request)

  int32_t num_in_flight() const {
    int32_t n = 0;
    for (const auto& f : in_flight) n += f.num_tokens;
    return n;
  }
  int32_t num_unknown() const {
    int32_t n = 0;
    for (const auto& f : in_flight) n += f.sample ? 1 : 0;
    return n;
  }
  // Tokens that exist, counting those sampled by steps in flight.
  int32_t length() const { return static_cast<int32_t>(tokens.size()) + num_unknown(); }
  int32_t num_scheduled() const { return num_computed + num_in_flight(); }
  // Tokens neither computed nor in flight: 1 for a decode, more mid-prefill.
  int32_t num_pending() const { return length() - num_scheduled(); }
  // Generated tokens, counting those still in flight.
  int32_t num_generated() const { return length() - num_prompt; }
};

}  // namespace troupe::core
