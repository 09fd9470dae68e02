#include "cluster/sim/prompt_builder.hpp"

#include <stdexcept>

#include "core/splitmix.hpp"

namespace troupe::cluster::sim {
namespace {

int32_t token(uint64_t key, uint64_t stream, uint64_t index, int32_t vocab) {
  const uint64_t h = core::splitmix64(key ^ core::splitmix64(stream ^ core::splitmix64(index)));
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
}

}  // namespace

std::vector<int32_t> build_prompt(const WorkloadRequest& r, uint64_t request_index, const PromptOptions& o) {
  if (o.vocab_size < 1 || o.trace_block_tokens < 1)
    throw std::invalid_argument("PromptOptions: vocab_size and trace_block_tokens must be >= 1");
  const uint64_t own_key = core::splitmix64(o.seed ^ 0x5eedULL),
                 shared_key = core::splitmix64(o.seed ^ 0xb10cULL);
  std::vector<int32_t> out(static_cast<size_t>(r.input_len));
  const size_t bt = static_cast<size_t>(o.trace_block_tokens);
  for (size_t j = 0; j < out.size(); ++j) {
    const size_t b = j / bt;
    out[j] = b < r.hash_ids.size() ? token(shared_key, r.hash_ids[b], j % bt, o.vocab_size)
                                   : token(own_key, request_index, j, o.vocab_size);
  }
  return out;
}

}  // namespace troupe::cluster::sim
