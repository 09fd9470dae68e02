#include "core/host_info.hpp"

#include <ctime>
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

std::string utc_now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace troupe::core
