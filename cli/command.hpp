#pragma once
// How cli/ is put together: each command file registers its subcommands and
// the function that runs each once its flags are parsed. Commands parse flags
// into option structs and call the libraries; they hold no logic of their own.
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace troupe::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // exit status
};

using Registry = std::vector<Command>;

void add_model_commands(CLI::App& app, Registry& registry);     // init-model, download, tokenize, detokenize
void add_generate_command(CLI::App& app, Registry& registry);   // generate
void add_batch_command(CLI::App& app, Registry& registry);      // batch

// The default tokenizer folder (GPT-2's vocab.json + merges.txt), used by init-model.
std::string default_tokenizer_dir();

// "1,2,3" -> ids; throws std::invalid_argument naming the bad item.
std::vector<int32_t> parse_id_list(const std::string& text);

}  // namespace troupe::cli
