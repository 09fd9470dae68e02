#include "common/bench_util.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe::bench {

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2]};
}

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= list.size();) {
    const size_t q = std::min(list.find(',', p), list.size());
    out.push_back(list.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

std::vector<model::CpuIsa> parse_variants(const std::string& list) {
  std::vector<model::CpuIsa> out;
  for (const std::string& name : split_commas(list)) {
    const model::CpuIsa isa = model::parse_isa(name);
    if (!model::cpu_supports(isa)) throw std::invalid_argument(model::why_unsupported(isa));
    out.push_back(isa);
  }
  return out;
}

std::vector<model::CpuIsa> vector_variants() {
  std::vector<model::CpuIsa> out;
  for (model::CpuIsa isa : {model::CpuIsa::kAvx512Bf16, model::CpuIsa::kAvx512, model::CpuIsa::kAvx2})
    if (model::cpu_supports(isa)) out.push_back(isa);
  return out;
}

}  // namespace troupe::bench
