#pragma once
// Memory sizes on the command line and in cluster files. Torch-free.
#include <cstdint>
#include <string>

namespace troupe::core {

// "2GiB", "512MiB", "1.5G", "100000" (bytes) -> bytes. std::invalid_argument on junk.
int64_t parse_memory_size(const std::string& text);

}  // namespace troupe::core
