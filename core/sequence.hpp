#pragma once
// The scheduler's state for one live request (internal to the Scheduler).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/request.hpp"
#include "core/step_plan.hpp"

namespace troupe::core {

// One step in flight that runs part of a sequence.
struct InFlight {
  uint64_t step_id = 0;
  int32_t num_tokens = 0;
  bool sample = false;  // the step samples this sequence's next token (unknown until the result)
};

// The steps in flight for one sequence, oldest first: at most 8
// (SchedulerOptions::max_steps_in_flight), kept inline so that reading the
// oldest one (every work item of every result) touches no other cache line.
class InFlightList {
 public:
  static constexpr int32_t kCapacity = 8;
  bool empty() const { return n_ == 0; }
  int32_t size() const { return n_; }
  const InFlight& front() const { return items_[0]; }
  const InFlight* begin() const { return items_; }
  const InFlight* end() const { return items_ + n_; }
  // Sums over the items, kept as they come and go (every step asks each
  // running sequence for them, several times).
  int32_t num_tokens() const { return tokens_; }
  int32_t num_sampling() const { return sampling_; }
  void push_back(const InFlight& f) {
    if (n_ == kCapacity) throw std::logic_error("Sequence: more than 8 steps in flight");
    items_[n_++] = f;
    tokens_ += f.num_tokens;
    sampling_ += f.sample ? 1 : 0;
  }
  void pop_front() {
    tokens_ -= items_[0].num_tokens;
    sampling_ -= items_[0].sample ? 1 : 0;
    std::move(items_ + 1, items_ + n_, items_);
    --n_;
  }
  void clear() { n_ = tokens_ = sampling_ = 0; }

 private:
  int32_t n_ = 0;  // first: beside the oldest item, in the sequence's first cache line
  int32_t tokens_ = 0, sampling_ = 0;  // sum of num_tokens, count of sample
  InFlight items_[kCapacity];
};

struct alignas(64) Sequence {  // its first line: what every step reads
  enum class State : uint8_t { kWaiting, kRunning };
  // First the fields every step reads for every work item, together, up to
  // the oldest step in flight: one cache line.
  bool finished = false;  // set just before removal
  bool ignore_eos = false;  // request.ignore_eos, max_tokens, id and whether prompt_logprobs
  State state = State::kWaiting;  // >= 0, copied here at submission: every step reads them,
  bool wants_prompt_scores = false;  // and `request` lies lines away
  int32_t num_prompt = 0;
  int32_t max_tokens = 0;
  // KV: tokens [0, num_computed) are in the cache; the steps in `in_flight`
  // (oldest first, at most max_steps_in_flight, one of them possibly the plan
  // being formed) compute the next ones. A sampling step adds a token the
  // worker knows before we do: decodes of it can be planned before its
  // result arrives (the worker feeds its own sample). A running sequence holds
  // exactly ceil(num_scheduled() / block_size) blocks; a waiting one none.
  int32_t num_computed = 0;
  uint64_t id = 0;
  int32_t plan_index = -1;  // work item in the plan being formed, -1 when absent
  int32_t slot = -1;        // in the scheduler's slab
  InFlightList in_flight;
  std::vector<int32_t> tokens;  // prompt, then generated ids received so far
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;  // chained names of the full blocks of `tokens` (grows lazily)
  int32_t num_registered = 0;    // blocks [0, num_registered) were offered to the prefix cache
  // The worker's copy: it holds the sequence (sent as a NewSequence, not
  // dropped since) and blocks [0, blocks_sent) of its table.
  bool known_to_worker = false;
  int32_t blocks_sent = 0;
  bool admitted_once = false;
  int32_t cached_tokens = 0;  // prefix-cache hit at first admission (usage)
  int32_t failures = 0;       // failed steps survived (the next one ends the request)
  int32_t prompt_scored = 0;  // prompt_logprobs: positions 1 .. prompt_scored delivered
  uint64_t arrival = 0;       // submission order: the policy's tie-break
  Request request;            // prompt_ids and output_ids moved out into `tokens`

  int32_t num_in_flight() const { return in_flight.num_tokens(); }
  int32_t num_unknown() const { return in_flight.num_sampling(); }
  // Tokens that exist, counting those sampled by steps in flight.
  int32_t length() const { return static_cast<int32_t>(tokens.size()) + num_unknown(); }
  int32_t num_scheduled() const { return num_computed + num_in_flight(); }
  // Tokens neither computed nor in flight: 1 for a decode, more mid-prefill.
  int32_t num_pending() const { return length() - num_scheduled(); }
  // Generated tokens, counting those still in flight.
  int32_t num_generated() const { return length() - num_prompt; }
  // Asks for prompt logprobs and has not had them all yet: its prompt rows
  // must run (no prefix-cache hit) and their scores come back.
  bool scoring() const {
    return wants_prompt_scores && prompt_scored < num_prompt - 1;
  }
  // Of the rows [start, start + n), those whose logits score a prompt token.
  int32_t score_rows(int32_t start, int32_t n) const {
    return wants_prompt_scores ? prompt_rows_scored(start, n, num_prompt) : 0;
  }
};

}  // namespace troupe::core
