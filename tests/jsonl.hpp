#pragma once
// The JSON lines of a file (a batch or submit output), blank lines skipped.
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace troupe::test {

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace troupe::test
