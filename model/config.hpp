#pragma once
// Gpt2Config: the shape of a GPT-2 model, read from a Hugging Face config.json.
#include <cstdint>
#include <string>

namespace troupe::model {

struct Gpt2Config {
  int n_layer = 12;           // transformer blocks
  int n_head = 12;            // attention heads per block
  int n_embd = 768;           // model width; must be a multiple of n_head
  int n_positions = 1024;     // maximum context length (prompt + generated tokens)
  int vocab_size = 50257;     // rows of wte
  double layer_norm_epsilon = 1e-5;
  int eos_token_id = 50256;   // <|endoftext|>
  // True when the weights were made by `troupe init-model` (random, not GPT-2's
  // trained weights): every command that loads such a model says so loudly.
  // Stored in config.json as "troupe_random_weights".
  bool random_weights = false;

  int head_dim() const { return n_embd / n_head; }

  // Parses config.json text. Throws std::runtime_error naming `origin` on bad
  // JSON, a missing/invalid field, or an unsupported activation_function /
  // model_type (only "gelu_new" and "gpt2" are GPT-2).
  static Gpt2Config from_json_text(const std::string& text, const std::string& origin);
  static Gpt2Config from_json_file(const std::string& path);
  std::string to_json() const;  // HF-compatible config.json (plus troupe_random_weights)

  // "tiny" (2 layers, 2 heads, 64 wide, 128 positions, real vocab) or "gpt2" (124M).
  static Gpt2Config preset(const std::string& name);
  void validate() const;  // throws std::invalid_argument on an impossible shape
};

}  // namespace troupe::model
