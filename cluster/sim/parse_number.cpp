#include "cluster/sim/parse_number.hpp"

#include <cmath>
#include <stdexcept>

namespace troupe::cluster::sim {

std::optional<double> parse_number(const std::string& text) {
  if (text.empty() || text.find_first_of(" \t\r\n") != std::string::npos) return std::nullopt;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace troupe::cluster::sim
