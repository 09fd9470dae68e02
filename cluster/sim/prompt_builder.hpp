#pragma once
// Prompt tokens for a simulated request. Only their equality matters (the
// scheduler's prefix cache compares blocks of tokens), so they are drawn from
// a keyed hash: a request without hash ids gets tokens of its own; a request
// with hash ids (Mooncake) gets, for its b-th trace block, the tokens of hash
// id hash_ids[b], so two prompts share a block's tokens exactly when they
// share that block's id (and the scheduler's chained prefix hashes then hit
// exactly when the whole prefix of ids is shared). Tokens past the last id's
// block are the request's own.
#include <cstdint>
#include <vector>

#include "cluster/sim/workload.hpp"

namespace troupe::cluster::sim {

struct PromptOptions {
  int32_t vocab_size = 50257;        // ids drawn from [0, vocab_size); >= 1
  int32_t trace_block_tokens = 512;  // tokens per hash id; >= 1
  uint64_t seed = 0;                 // different seeds, different (but equally shaped) prompts
};

// request_index: the request's position in its workload (its own tokens).
// The vector has room for the request's output too (the scheduler appends
// it to the prompt's tokens: no reallocation and copy at admission).
std::vector<int32_t> build_prompt(const WorkloadRequest& request, uint64_t request_index,
                                  const PromptOptions& options);

}  // namespace troupe::cluster::sim
