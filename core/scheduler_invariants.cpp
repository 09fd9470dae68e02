// Scheduler::check_invariants: the whole-state audit tests run after every
// operation. O(blocks + sequences * blocks per sequence); not for production paths.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/scheduler.hpp"
#include "core/sequence.hpp"

namespace troupe::core {
namespace {

void broken(const std::string& what) { throw std::logic_error("Scheduler invariant: " + what); }

}  // namespace

void Scheduler::check_invariants() const {
  allocator_.check_invariants();
  std::vector<int32_t> owners(static_cast<size_t>(options_.num_blocks), 0);
  size_t num_running = 0;
  auto step_in_flight = [this](uint64_t step) {
    return std::any_of(in_flight_steps_.begin(), in_flight_steps_.end(),
                       [step](const StepRecord& r) { return r.step_id == step; });
  };
  for (const auto& [id, ptr] : seqs_) {
    const Sequence& s = *ptr;
    const std::string who = "seq " + std::to_string(id) + ": ";
    if (s.request.id != id || s.id != id) broken(who + "stored under the wrong id");
    if (s.max_tokens != s.request.max_tokens || s.ignore_eos != s.request.ignore_eos)
      broken(who + "its copies of the request's limits differ from the request");
    if (s.slot < 0 || static_cast<size_t>(s.slot) >= slab_.size() ||
        slab_[static_cast<size_t>(s.slot)].get() != ptr)
      broken(who + "not in its slab slot");
    if (s.finished || s.plan_index != -1) broken(who + "finished or planned outside schedule()");
    const auto received = static_cast<int32_t>(s.tokens.size()) - s.num_prompt;
    if (received < 0 || (received >= s.request.max_tokens && !(received == 0 && s.request.max_tokens == 0)))
      broken(who + "received count out of range");
    if (s.prompt_scored < 0 || s.prompt_scored > std::max(0, s.num_prompt - 1))
      broken(who + "prompt_scored out of range");
    if (s.num_generated() > s.request.max_tokens)
      broken(who + "more tokens in flight than max_tokens allows");
    if (s.length() > options_.max_model_len) broken(who + "longer than max_model_len");
    if (s.state == Sequence::State::kWaiting) {
      if (waiting_.count(wait_key(s)) == 0) broken(who + "waiting but not queued");
      if (!s.blocks.empty() || s.num_computed != 0 || !s.in_flight.empty()) broken(who + "waiting with KV");
      if (s.known_to_worker) broken(who + "waiting but still held by the worker");
      continue;
    }
    ++num_running;
    if (std::find(running_.begin(), running_.end(), &s) == running_.end())
      broken(who + "running but not listed");
    if (!s.known_to_worker) broken(who + "running but unknown to the worker");
    const int32_t held = s.num_scheduled();
    if (held > s.length()) broken(who + "more KV than tokens");
    if (s.num_computed > static_cast<int32_t>(s.tokens.size()))
      broken(who + "computed a token it does not know");
    if (static_cast<int32_t>(s.blocks.size()) != blocks_for(held)) {
      broken(who + "holds " + std::to_string(s.blocks.size()) + " blocks for " + std::to_string(held) +
             " tokens (at most block_size - 1 slots may be unused)");
    }
    if (s.blocks_sent != static_cast<int32_t>(s.blocks.size())) broken(who + "blocks not sent to the worker");
    uint64_t last_step = 0;
    int32_t in_flight_tokens = 0, in_flight_sampling = 0;
    for (const auto& f : s.in_flight) {
      if (!step_in_flight(f.step_id) || f.step_id <= last_step || f.num_tokens < 1) {
        broken(who + "stale or disordered in-flight work");
      }
      last_step = f.step_id;
      in_flight_tokens += f.num_tokens;
      in_flight_sampling += f.sample ? 1 : 0;
    }
    if (in_flight_tokens != s.in_flight.num_tokens() || in_flight_sampling != s.in_flight.num_sampling())
      broken(who + "in-flight sums disagree with the in-flight items");
    if (s.in_flight.empty() && held >= s.length()) broken(who + "running with nothing left to compute");
    if (s.num_registered > s.num_computed / options_.block_size)
      broken(who + "registered an uncomputed block");
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const int32_t b = s.blocks[i];
      if (b < 0 || b >= options_.num_blocks) broken(who + "bad block id");
      if (std::find(s.blocks.begin(), s.blocks.begin() + static_cast<ptrdiff_t>(i), b) !=
          s.blocks.begin() + static_cast<ptrdiff_t>(i)) {
        broken(who + "holds block " + std::to_string(b) + " twice");
      }
      ++owners[static_cast<size_t>(b)];
    }
  }
  if (running_.size() != num_running) broken("running list has duplicates or strangers");
  for (size_t i = 1; i < running_.size(); ++i) {
    if (!(wait_key(*running_[i - 1]) < wait_key(*running_[i])))
      broken("running list out of (priority, arrival) order");
  }
  if (waiting_.size() + num_running != seqs_.size()) broken("waiting queue has duplicates or strangers");
  if (slab_.size() != seqs_.size() + free_slots_.size()) broken("slab slots neither live nor free");
  for (const auto& key : waiting_) {
    auto it = seqs_.find(std::get<2>(key));
    if (it == seqs_.end() || it->second->state != Sequence::State::kWaiting)
      broken("waiting queue holds a stranger");
  }
  for (int32_t b = 0; b < options_.num_blocks; ++b) {
    const int32_t o = owners[static_cast<size_t>(b)];
    if (allocator_.ref_count(b) != o) {
      broken("block " + std::to_string(b) + " has ref " + std::to_string(allocator_.ref_count(b)) + " but " +
             std::to_string(o) + " owners");
    }
    if (o > 1 && !allocator_.is_cached(b)) broken("block " + std::to_string(b) + " shared but not cached");
  }
  if (static_cast<int32_t>(in_flight_steps_.size()) > options_.max_steps_in_flight)
    broken("too many steps in flight");
}

}  // namespace troupe::core
