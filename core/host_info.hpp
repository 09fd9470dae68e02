#pragma once
// What the process runs on, for reports and benchmark headers. Torch-free.
#include <string>

namespace troupe::core {

// "model name" of the first processor in /proc/cpuinfo, or "unknown CPU".
const std::string& cpu_model_name();

// The time now, UTC, ISO 8601 to the second ("2026-12-05T08:40:00Z"): when a
// profile was measured.
std::string utc_now_iso8601();

}  // namespace troupe::core
