#pragma once
// JSON from users (an HTTP body, a JSONL job line) parsed so that every
// failure is the user's error and names where it is. nlohmann's parser
// throws a bare out_of_range for a number past a double ("temperature":
// 1e999), which became a 500 naming nothing; here it is an invalid input
// naming the key that holds it ("temperature", "logit_bias.50256").
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace troupe::cluster {

class JsonInputError : public std::invalid_argument {
 public:
  JsonInputError(std::string field, const std::string& message)
      : std::invalid_argument(message), field_(std::move(field)) {}
  // The key path of the bad value ("" when the text is not JSON at all).
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// Parses `text`; throws JsonInputError: "temperature: the number 1e999 is out
// of range", or "not valid JSON: ..." (field "").
nlohmann::json parse_json_input(const std::string& text);

}  // namespace troupe::cluster
