#pragma once
// A tiny random GPT-2 folder for tests (torch-heavy, so apart from test_utils.hpp).
#include <string>

#include "model/config.hpp"
#include "model/model_dir.hpp"
#include "test_utils.hpp"

namespace troupe::test {

// Preset "tiny" (2 layers, 2 heads, width 64, 128 positions, real vocab),
// random weights of seed 1234, GPT-2's real tokenizer files. Written once per
// test process and removed at exit; treat it as read-only.
inline const std::string& tiny_model_dir() {
  static TempDir dir;
  static const bool written = [] {
    model::write_random_model(dir.path(), model::Gpt2Config::preset("tiny"), 1234, tokenizer_dir());
    return true;
  }();
  (void)written;
  return dir.path();
}

}  // namespace troupe::test
