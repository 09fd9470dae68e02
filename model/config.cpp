#include "model/config.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace troupe::model {
namespace {

using nlohmann::json;

// Reads an integer field; `alt` is an alternative key tried when `key` is absent.
int int_field(const json& j, const std::string& key, const std::string& origin,
              const char* alt = nullptr) {
  const json* v = nullptr;
  if (j.contains(key)) v = &j.at(key);
  else if (alt && j.contains(alt)) v = &j.at(alt);
  if (!v) {
    throw std::runtime_error(origin + ": missing field \"" + key + "\"" +
                             (alt ? std::string(" (or \"") + alt + "\")" : std::string()));
  }
  if (!v->is_number_integer()) {
    throw std::runtime_error(origin + ": field \"" + key + "\" must be an integer, got " +
                             v->dump());
  }
  const auto x = v->get<int64_t>();
  if (x <= 0 || x > (int64_t{1} << 30)) {
    throw std::runtime_error(origin + ": field \"" + key + "\" must be positive, got " +
                             std::to_string(x));
  }
  return static_cast<int>(x);
}

void check_string(const json& j, const std::string& key, const std::string& want,
                  const std::string& origin) {
  if (!j.contains(key) || j.at(key).is_null()) return;
  const json& v = j.at(key);
  if (!v.is_string() || v.get<std::string>() != want) {
    throw std::runtime_error(origin + ": unsupported " + key + " " + v.dump() +
                             " (troupe runs GPT-2 only: " + key + " must be \"" + want + "\")");
  }
}

}  // namespace

Gpt2Config Gpt2Config::from_json_text(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(origin + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(origin + ": expected a JSON object");

  check_string(j, "model_type", "gpt2", origin);
  check_string(j, "activation_function", "gelu_new", origin);

  Gpt2Config c;
  c.n_layer = int_field(j, "n_layer", origin);
  c.n_head = int_field(j, "n_head", origin);
  c.n_embd = int_field(j, "n_embd", origin);
  c.n_positions = int_field(j, "n_positions", origin, "n_ctx");
  c.vocab_size = int_field(j, "vocab_size", origin);
  if (j.contains("layer_norm_epsilon")) {
    const json& v = j.at("layer_norm_epsilon");
    if (!v.is_number() || !(v.get<double>() > 0)) {
      throw std::runtime_error(origin + ": field \"layer_norm_epsilon\" must be a positive number, got " +
                               v.dump());
    }
    c.layer_norm_epsilon = v.get<double>();
  } else {
    throw std::runtime_error(origin + ": missing field \"layer_norm_epsilon\"");
  }
  if (j.contains("eos_token_id") && !j.at("eos_token_id").is_null()) {
    const json& v = j.at("eos_token_id");
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.vocab_size) {
      throw std::runtime_error(origin + ": field \"eos_token_id\" must be an id below vocab_size, got " +
                               v.dump());
    }
    c.eos_token_id = static_cast<int>(v.get<int64_t>());
  }
  if (j.contains("troupe_random_weights")) {
    const json& v = j.at("troupe_random_weights");
    if (!v.is_boolean()) {
      throw std::runtime_error(origin + ": field \"troupe_random_weights\" must be true or false");
    }
    c.random_weights = v.get<bool>();
  }
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(origin + ": " + e.what());
  }
  return c;
}

Gpt2Config Gpt2Config::from_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open config file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

std::string Gpt2Config::to_json() const {
  json j;
  j["model_type"] = "gpt2";
  j["architectures"] = json::array({"GPT2LMHeadModel"});
  j["activation_function"] = "gelu_new";
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_embd"] = n_embd;
  j["n_positions"] = n_positions;
  j["n_ctx"] = n_positions;
  j["vocab_size"] = vocab_size;
  j["layer_norm_epsilon"] = layer_norm_epsilon;
  j["bos_token_id"] = 50256;
  j["eos_token_id"] = eos_token_id;
  j["initializer_range"] = 0.02;
  j["n_inner"] = nullptr;
  j["attn_pdrop"] = 0.1;
  j["embd_pdrop"] = 0.1;
  j["resid_pdrop"] = 0.1;
  j["scale_attn_weights"] = true;
  j["use_cache"] = true;
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = "float32";
  j["troupe_random_weights"] = random_weights;
  return j.dump(2) + "\n";
}

Gpt2Config Gpt2Config::preset(const std::string& name) {
  Gpt2Config c;
  if (name == "tiny") {
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 64;
    c.n_positions = 128;
  } else if (name == "gpt2") {
    c.n_layer = 12;
    c.n_head = 12;
    c.n_embd = 768;
    c.n_positions = 1024;
  } else if (name == "gpt2-medium" || name == "gpt2-large" || name == "gpt2-xl") {
    // Hugging Face's config.json of each (355M, 774M, 1.5B parameters).
    c.n_layer = name == "gpt2-medium" ? 24 : name == "gpt2-large" ? 36 : 48;
    c.n_head = name == "gpt2-medium" ? 16 : name == "gpt2-large" ? 20 : 25;
    c.n_embd = name == "gpt2-medium" ? 1024 : name == "gpt2-large" ? 1280 : 1600;
    c.n_positions = 1024;
  } else {
    throw std::invalid_argument("unknown model preset \"" + name +
                                "\"; valid presets: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl");
  }
  c.vocab_size = 50257;
  return c;
}

void Gpt2Config::validate() const {
  auto positive = [](int v, const char* what) {
    if (v <= 0) {
      throw std::invalid_argument(std::string(what) + " must be positive, got " +
                                  std::to_string(v));
    }
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(n_embd, "n_embd");
  positive(n_positions, "n_positions");
  positive(vocab_size, "vocab_size");
  if (n_embd % n_head != 0) {
    throw std::invalid_argument("n_embd (" + std::to_string(n_embd) +
                                ") must be a multiple of n_head (" + std::to_string(n_head) + ")");
  }
  if (!(layer_norm_epsilon > 0)) {
    throw std::invalid_argument("layer_norm_epsilon must be positive");
  }
  if (eos_token_id < 0 || eos_token_id >= vocab_size) {
    throw std::invalid_argument("eos_token_id " + std::to_string(eos_token_id) +
                                " is outside the vocabulary of " + std::to_string(vocab_size));
  }
}

}  // namespace troupe::model
