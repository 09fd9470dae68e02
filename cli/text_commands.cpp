// tokenize, detokenize: GPT-2's tokenizer on the command line (no model loaded).
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "model/text/tokenizer.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;

std::string dump_line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

model::Tokenizer load_tokenizer(const std::string& dir) {
  if (!std::filesystem::is_directory(dir))
    throw std::invalid_argument("model folder '" + dir +
                                "' does not exist (make one with `troupe init-model --out " + dir +
                                "` or `troupe download gpt2 --to " + dir + "`)");
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

void add_text_commands(CLI::App& app, Registry& registry) {
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
                                if (!v.is_number_integer())
                                  throw std::invalid_argument("ids must be integers");
                                ids.push_back(v.get<int32_t>());
                              }
                              return json{{"text", tok.decode(ids)}};
                            });
                          }
                          if (o->ids.empty())
                            throw std::invalid_argument("give IDS, or --jsonl to read lines from stdin");
                          std::cout << tok.decode(parse_id_list(o->ids)) << '\n';
                          return 0;
                        }});
  }
}

}  // namespace troupe::cli
