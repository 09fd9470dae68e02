// The flag checks and parsers that the commands share (cli/command.hpp).
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cli/command.hpp"
#include "core/sampling_params.hpp"

namespace troupe::cli {
namespace {

CLI::Validator number_check(bool (*ok)(double), const std::string& rule) {
  return CLI::Validator(
      [ok, rule](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v))
          return "must be a number, got '" + text + "'";
        return ok(v) ? std::string() : "must be " + rule + ", got " + text;
      },
      rule);
}

}  // namespace

const CLI::Validator& positive_number() {
  static const CLI::Validator v = number_check([](double x) { return x > 0; }, "> 0");
  return v;
}

const CLI::Validator& non_negative_number() {
  static const CLI::Validator v = number_check([](double x) { return x >= 0; }, ">= 0");
  return v;
}

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    if (b == std::string::npos) throw std::invalid_argument("empty item in id list '" + text + "'");
    item = item.substr(b, e - b + 1);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX)
      throw std::invalid_argument("'" + item + "' in id list is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw std::invalid_argument("the id list is empty");
  return ids;
}

void add_logit_flags(CLI::App* sub, float& presence, float& frequency, float& repetition,
                     std::vector<std::string>& bias) {
  sub->add_option("--presence-penalty", presence,
                  "Subtracted from the logit of every token generated so far, once ([-2, 2]; 0 = off)")
      ->check(CLI::Range(-2.0, 2.0));
  sub->add_option("--frequency-penalty", frequency,
                  "Subtracted from a token's logit per time it was generated so far ([-2, 2]; 0 = off)")
      ->check(CLI::Range(-2.0, 2.0));
  sub->add_option(
         "--repetition-penalty", repetition,
         "Divides the positive logits (multiplies the others) of every token in the prompt or generated "
         "so far ((0, 10]; 1 = off)")
      ->check(CLI::Range(0.0, 10.0));
  sub->add_option("--logit-bias", bias, "ID=BIAS: add BIAS ([-100, 100]) to token ID's logit (repeatable)");
}

std::vector<std::pair<int32_t, float>> parse_logit_bias(const std::vector<std::string>& items) {
  std::vector<std::pair<int32_t, float>> out;
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    const std::optional<int32_t> id = core::token_id_from_text(item.substr(0, eq));
    const char* bias = eq == std::string::npos ? "" : item.c_str() + eq + 1;
    char* end = nullptr;
    const double b = std::strtod(bias, &end);
    if (!id || end == bias || *end != '\0' || !std::isfinite(b))
      throw std::invalid_argument("--logit-bias '" + item + "' is not ID=BIAS (a token id and a number)");
    out.emplace_back(*id, static_cast<float>(b));
  }
  return out;
}

}  // namespace troupe::cli
