#include "actors/router/output_text.hpp"

#include <utility>

namespace troupe::actors {

OutputText::OutputText(const model::Tokenizer& tokenizer, std::vector<std::string> stops)
    : decoder_(tokenizer), matcher_(std::move(stops)) {}

std::string OutputText::push(int32_t id) {
  if (matcher_.matched()) return {};
  std::string out = matcher_.push(decoder_.push(id));
  text_ += out;
  return out;
}

std::string OutputText::flush() {
  if (matcher_.matched()) return {};
  std::string out = matcher_.push(decoder_.flush());
  out += matcher_.flush();
  text_ += out;
  return out;
}

}  // namespace troupe::actors
