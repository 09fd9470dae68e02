#include "model/text/stop_matcher.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe::model {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty())
      throw std::invalid_argument("stop string " + std::to_string(i) +
                                  " is empty; remove it (an empty string would match at once)");
    longest_ = std::max(longest_, stops_[i].size());
  }
}

std::string StopMatcher::push(const std::string& delta) {
  if (matched_) return {};
  held_ += delta;
  // Everything before held_ was emitted with no stop inside it and no stop
  // prefix at its end, so any stop occurrence lies entirely inside held_.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  const size_t keep = partial_suffix();
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!matched_) out.swap(held_);
  held_.clear();
  return out;
}

size_t StopMatcher::partial_suffix() const {
  // A held suffix is shorter than the longest stop (a full one would have matched).
  const size_t max_len = std::min(held_.size(), longest_ == 0 ? 0 : longest_ - 1);
  for (size_t len = max_len; len > 0; --len) {
    const size_t from = held_.size() - len;
    for (const auto& s : stops_)
      if (s.size() > len && held_.compare(from, len, s, 0, len) == 0) return len;
  }
  return 0;
}

}  // namespace troupe::model
