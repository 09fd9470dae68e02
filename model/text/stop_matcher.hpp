#pragma once
// StopMatcher: finds stop strings in text that arrives in pieces (streamed
// token by token) and decides how much of it may be shown now.
//
// Text that could still turn out to be the start of a stop string is held
// back until the next piece settles it; once a stop string is complete, the
// text before it is released and everything from the stop string on is
// dropped. The stream stops at the first push after which the text holds a
// stop string (a longer stop that began earlier but is still incomplete does
// not count), as a server checks stops after each token. Matching is on
// bytes: with valid UTF-8 input and stop strings, the released text never
// ends inside a character.
#include <string>
#include <vector>

namespace troupe::model {

class StopMatcher {
 public:
  // Throws std::invalid_argument if any stop string is empty. No stop strings
  // is fine: every piece is then released as it comes.
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends `delta` and returns the text that is now safe to emit. After a
  // match, returns the text up to where the earliest stop string starts, and
  // nothing ever after.
  std::string push(const std::string& delta);

  // True once a stop string has been seen.
  bool matched() const { return matched_; }

  // End of the stream: releases the held-back text (nothing after a match).
  std::string flush();

 private:
  // Length of the longest suffix of held_ that is a proper prefix of a stop.
  size_t partial_suffix() const;

  std::vector<std::string> stops_;
  size_t longest_ = 0;   // bytes of the longest stop string
  std::string held_;     // received, not yet emitted
  bool matched_ = false;
};

}  // namespace troupe::model
