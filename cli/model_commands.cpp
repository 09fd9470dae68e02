// init-model, convert, download (tokenize and detokenize: text_commands.cpp).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "core/sampling_params.hpp"
#include "model/config.hpp"
#include "model/download.hpp"
#include "model/linear.hpp"
#include "model/model_dir.hpp"
#include "model/text/tokenizer.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;

}  // namespace

std::string default_tokenizer_dir() {
  if (const char* env = std::getenv("TROUPE_TOKENIZER_DIR")) return env;
  return TROUPE_DEFAULT_TOKENIZER_DIR;
}

void add_model_commands(CLI::App& app, Registry& registry) {
  // init-model
  {
    auto* sub = app.add_subcommand("init-model", "Write a model folder with random GPT-2 weights");
    struct Opts {
      std::string out, preset = "tiny", tokenizer;
      int layers = 0, heads = 0, embd = 0, positions = 0;
      uint64_t seed = 0;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--out", o->out, "Folder to write (config.json, model.safetensors, vocab.json, merges.txt)")
        ->required();
    sub->add_option("--preset", o->preset, "Shape: tiny (2x2x64) or gpt2 (the real 124M shape)")
        ->check(CLI::IsMember({"tiny", "gpt2"}));
    sub->add_option("--layers", o->layers, "Override n_layer")->check(positive_number());
    sub->add_option("--heads", o->heads, "Override n_head")->check(positive_number());
    sub->add_option("--embd", o->embd, "Override n_embd (a multiple of heads)")->check(positive_number());
    sub->add_option("--positions", o->positions, "Override n_positions")->check(positive_number());
    sub->add_option("--seed", o->seed, "Random seed (same seed, same weights)");
    sub->add_option("--tokenizer", o->tokenizer, "Folder with GPT-2's vocab.json and merges.txt (default: " +
                                                     std::string(TROUPE_DEFAULT_TOKENIZER_DIR) + ")");
    registry.push_back({sub, [o] {
                          auto cfg = model::Gpt2Config::preset(o->preset);
                          if (o->layers) cfg.n_layer = o->layers;
                          if (o->heads) cfg.n_head = o->heads;
                          if (o->embd) cfg.n_embd = o->embd;
                          if (o->positions) cfg.n_positions = o->positions;
                          cfg.validate();
                          std::string tok = o->tokenizer.empty() ? default_tokenizer_dir() : o->tokenizer;
                          model::write_random_model(o->out, cfg, o->seed, tok);
                          std::fprintf(stderr,
                                       "wrote a RANDOM-WEIGHT GPT-2 (%d layers, %d heads, width %d, %d positions) "
                                       "to %s; its text is noise\n",
                                       cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_positions, o->out.c_str());
                          return 0;
                        }});
  }
  // convert
  {
    auto* sub = app.add_subcommand(
        "convert",
        "Write a model folder again with its weight matrices in bfloat16 (half the file) or float32");
    struct Opts {
      std::string model, out, dtype = "bfloat16";
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--model", o->model, "Model folder to read")->required();
    sub->add_option("--out", o->out,
                    "New folder to write (config.json, model.safetensors, vocab.json, merges.txt)")
        ->required();
    sub->add_option(
           "--dtype", o->dtype,
           "The matrices' storage: bfloat16 (default; what --dtype bfloat16 loads, bit for bit, from half "
           "the bytes) or float32; the norms and biases stay float32")
        ->check(CLI::IsMember({"float32", "bfloat16", "fp32", "bf16"}));
    registry.push_back(
        {sub, [o] {
           const model::WeightDtype dtype = model::parse_weight_dtype(o->dtype);
           const uint64_t bytes = model::convert_model(o->model, o->out, dtype);
           const uint64_t from =
               std::filesystem::file_size(std::filesystem::path(o->model) / "model.safetensors");
           std::fprintf(stderr, "wrote %s: matrices in %s, model.safetensors %.1f MB (was %.1f MB)\n",
                        o->out.c_str(), dtype == model::WeightDtype::kBFloat16 ? "bfloat16" : "float32",
                        static_cast<double>(bytes) / 1e6, static_cast<double>(from) / 1e6);
           return 0;
         }});
  }
  // download
  {
    auto* sub = app.add_subcommand("download", "Fetch GPT-2's files from Hugging Face over HTTPS");
    struct Opts {
      std::string name = "gpt2", to;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("name", o->name, "Model repository: gpt2, gpt2-medium, gpt2-large, gpt2-xl");
    sub->add_option("--to", o->to, "Destination folder (default models/<name>)");
    registry.push_back({sub, [o] {
                          std::string to = o->to.empty() ? "models/" + o->name : o->to;
                          model::download_model(o->name, to, model::DownloadOptions{});
                          std::fprintf(stderr, "downloaded %s to %s\n", o->name.c_str(), to.c_str());
                          return 0;
                        }});
  }
}

}  // namespace troupe::cli
