#pragma once
// What the process runs on, for reports and benchmark headers. Torch-free.
#include <string>

namespace troupe::core {

// "model name" of the first processor in /proc/cpuinfo, or "unknown CPU".
const std::string& cpu_model_name();

}  // namespace troupe::core
