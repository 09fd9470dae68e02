// init-model, convert, download, tokenize, detokenize.
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

std::string dump_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

model::Tokenizer load_tokenizer(const std::string& dir) {
  if (!std::filesystem::is_directory(dir))
    throw std::invalid_argument("model folder '" + dir + "' does not exist (make one with `troupe init-model --out " +
                                dir + "` or `troupe download gpt2 --to " + dir + "`)");
  return model::Tokenizer::from_dir(dir);
}

// Reads JSON lines from stdin, maps each through `fn`; a bad line yields {"error": ...}
// and the rest still run. Returns 1 when any line failed.
int map_jsonl(const std::function<json(const json&)>& fn) {
  std::string line;
  int status = 0;
  size_t lineno = 0;
  while (std::getline(std::cin, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json out;
    try {
      out = fn(json::parse(line));
    } catch (const std::exception& e) {
      out = json{{"error", "line " + std::to_string(lineno) + ": " + e.what()}};
      status = 1;
    }
    std::cout << dump_line(out) << '\n';
  }
  std::cout.flush();
  return status;
}

}  // namespace

std::string default_tokenizer_dir() {
  if (const char* env = std::getenv("TROUPE_TOKENIZER_DIR")) return env;
  return TROUPE_DEFAULT_TOKENIZER_DIR;
}

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
  // tokenize
  {
    auto* sub = app.add_subcommand("tokenize", "Text to GPT-2 token ids (JSON)");
    struct Opts {
      std::string model, text;
      bool jsonl = false;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--model", o->model, "Model folder (vocab.json, merges.txt)")->required();
    sub->add_option("text", o->text, "Text to tokenize");
    sub->add_flag("--jsonl", o->jsonl, "Read {\"text\": ...} lines from stdin, write {\"ids\": [...]} lines");
    registry.push_back({sub, [o, sub] {
                          auto tok = load_tokenizer(o->model);
                          if (o->jsonl) {
                            return map_jsonl([&](const json& in) {
                              if (!in.is_object() || !in.contains("text") || !in["text"].is_string())
                                throw std::invalid_argument("expected an object with a string \"text\"");
                              return json{{"ids", tok.encode(in["text"].get<std::string>())}};
                            });
                          }
                          if (sub->count("text") == 0)
                            throw std::invalid_argument("give TEXT, or --jsonl to read lines from stdin");
                          std::cout << dump_line(json(tok.encode(o->text))) << '\n';
                          return 0;
                        }});
  }
  // detokenize
  {
    auto* sub = app.add_subcommand("detokenize", "GPT-2 token ids to text");
    struct Opts {
      std::string model, ids;
      bool jsonl = false;
    };
    auto o = std::make_shared<Opts>();
    sub->add_option("--model", o->model, "Model folder (vocab.json, merges.txt)")->required();
    sub->add_option("ids", o->ids, "Comma-separated ids, e.g. 15496,995");
    sub->add_flag("--jsonl", o->jsonl, "Read {\"ids\": [...]} lines from stdin, write {\"text\": ...} lines");
    registry.push_back({sub, [o] {
                          auto tok = load_tokenizer(o->model);
                          if (o->jsonl) {
                            return map_jsonl([&](const json& in) {
                              if (!in.is_object() || !in.contains("ids") || !in["ids"].is_array())
                                throw std::invalid_argument("expected an object with an array \"ids\"");
                              std::vector<int32_t> ids;
                              for (const auto& v : in["ids"]) {
                                if (!v.is_number_integer()) throw std::invalid_argument("ids must be integers");
                                ids.push_back(v.get<int32_t>());
                              }
                              return json{{"text", tok.decode(ids)}};
                            });
                          }
                          if (o->ids.empty()) throw std::invalid_argument("give IDS, or --jsonl to read lines from stdin");
                          std::cout << tok.decode(parse_id_list(o->ids)) << '\n';
                          return 0;
                        }});
  }
}

}  // namespace troupe::cli
