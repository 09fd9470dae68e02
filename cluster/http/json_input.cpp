#include "cluster/http/json_input.hpp"

#include <vector>

namespace troupe::cluster {
namespace {

using json = nlohmann::json;

// Follows the key path of the value being read, so that a number too large
// for a double can be named; builds nothing (json::parse builds the value).
class KeyPath : public nlohmann::json_sax<json> {
 public:
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    path_.push_back({"", false});
    return true;
  }
  bool key(string_t& k) override {
    path_.back() = {k, false};
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    path_.push_back({"", true, 0});
    return true;
  }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string& token, const nlohmann::detail::exception& e) override {
    if (e.id == 406) {  // out_of_range.406: number overflow
      std::string where;
      for (const Level& l : path_) {
        if (l.array)
          where += "[" + std::to_string(l.index) + "]";
        else
          where += (where.empty() ? "" : ".") + l.key;
      }
      field_ = where.empty() ? "(the whole body)" : where;
      token_ = token;
    }
    return false;
  }
  const std::string& field() const { return field_; }
  const std::string& token() const { return token_; }

 private:
  struct Level {
    std::string key;
    bool array = false;
    size_t index = 0;
  };
  bool value() {  // an array's element is done: the next has the next index
    if (!path_.empty() && path_.back().array) ++path_.back().index;
    return true;
  }
  bool close() {
    path_.pop_back();
    return value();
  }
  std::vector<Level> path_;
  std::string field_, token_;
};

}  // namespace

json parse_json_input(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::out_of_range& e) {
    KeyPath path;
    json::sax_parse(text, &path);
    if (path.field().empty()) throw JsonInputError("", std::string("not valid JSON: ") + e.what());
    throw JsonInputError(path.field(), path.field() + ": the number " + path.token() +
                                           " is out of range (not a finite double)");
  } catch (const json::exception& e) {
    throw JsonInputError("", std::string("not valid JSON: ") + e.what());
  }
}

}  // namespace troupe::cluster
