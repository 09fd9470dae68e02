#include "core/memory_size.hpp"

#include <cmath>
#include <stdexcept>

namespace troupe::core {

int64_t parse_memory_size(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("'" + text + "' is not a memory size (e.g. 2GiB, 512MiB, 100000)");
  }
  std::string unit = text.substr(pos);
  double mult = 0;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k")
    mult = 1024.0;
  else if (unit == "M" || unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  if (mult == 0 || !std::isfinite(value) || value <= 0)
    throw std::invalid_argument("'" + text + "' is not a memory size (e.g. 2GiB, 512MiB, 100000)");
  double bytes = value * mult;
  if (bytes > 9e18) throw std::invalid_argument("memory size '" + text + "' is too large");
  return static_cast<int64_t>(bytes);
}

}  // namespace troupe::core
