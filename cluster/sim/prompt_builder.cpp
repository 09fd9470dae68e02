#include "cluster/sim/prompt_builder.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/splitmix.hpp"

namespace troupe::cluster::sim {
namespace {

// index_mix = splitmix64(index), from index_mixes().
int32_t token(uint64_t key, uint64_t stream, uint64_t index_mix, int32_t vocab) {
  const uint64_t h = core::splitmix64(key ^ core::splitmix64(stream ^ index_mix));
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
}

// splitmix64(j) for j in [0, n): the same for every prompt, so computed once
// (per thread: simulations may run on several).
const std::vector<uint64_t>& index_mixes(size_t n) {
  thread_local std::vector<uint64_t> mix;
  while (mix.size() < n) mix.push_back(core::splitmix64(mix.size()));
  return mix;
}

}  // namespace

std::vector<int32_t> build_prompt(const WorkloadRequest& r, uint64_t request_index, const PromptOptions& o) {
  if (o.vocab_size < 1 || o.trace_block_tokens < 1)
    throw std::invalid_argument("PromptOptions: vocab_size and trace_block_tokens must be >= 1");
  const uint64_t own_key = core::splitmix64(o.seed ^ 0x5eedULL),
                 shared_key = core::splitmix64(o.seed ^ 0xb10cULL);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(r.input_len) + static_cast<size_t>(std::max(r.output_len, 0)));
  out.resize(static_cast<size_t>(r.input_len));
  const size_t bt = static_cast<size_t>(o.trace_block_tokens);
  const std::vector<uint64_t>& mix = index_mixes(out.size());  // j % bt <= j < out.size()
  for (size_t j = 0; j < out.size(); ++j) {
    const size_t b = j / bt;
    out[j] = b < r.hash_ids.size() ? token(shared_key, r.hash_ids[b], mix[j % bt], o.vocab_size)
                                   : token(own_key, request_index, mix[j], o.vocab_size);
  }
  return out;
}

}  // namespace troupe::cluster::sim
