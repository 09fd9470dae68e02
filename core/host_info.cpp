#include "core/host_info.hpp"

#include <fstream>

namespace troupe::core {

const std::string& cpu_model_name() {
  static const std::string name = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) != 0) continue;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) break;
      const size_t start = line.find_first_not_of(" \t", colon + 1);
      return start == std::string::npos ? std::string("unknown CPU") : line.substr(start);
    }
    return std::string("unknown CPU");
  }();
  return name;
}

}  // namespace troupe::core
