#pragma once
// The number a whole string spells ("12", "0.5", "1e3"), or nullopt when it
// spells something else (empty, trailing text, not finite). One parser for the
// simulator's flags, length specs and trace fields.
#include <optional>
#include <string>

namespace troupe::cluster::sim {

std::optional<double> parse_number(const std::string& text);

}  // namespace troupe::cluster::sim
