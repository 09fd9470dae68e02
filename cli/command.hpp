#pragma once
// How cli/ is put together: each command file registers its subcommands and
// the function that runs each once its flags are parsed. Commands parse flags
// into option structs and call the libraries; they hold no logic of their own.
// Two binaries share them (cli/command_line.hpp): `troupe` runs the clients'
// commands, which never load the model, and hands every other command to
// `troupe-engine`, which has them all. Nothing declared here needs libtorch;
// the model's flags are cli/model_flags.hpp.
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

void add_model_commands(CLI::App& app, Registry& registry);     // init-model, convert, download
void add_text_commands(CLI::App& app, Registry& registry);      // tokenize, detokenize
void add_generate_command(CLI::App& app, Registry& registry);   // generate
void add_batch_command(CLI::App& app, Registry& registry);      // batch
void add_perplexity_command(CLI::App& app, Registry& registry);  // perplexity
void add_cluster_commands(CLI::App& app, Registry& registry);    // serve, worker
void add_key_commands(CLI::App& app, Registry& registry);        // keygen
void add_submit_commands(CLI::App& app, Registry& registry);    // submit, status
void add_profile_command(CLI::App& app, Registry& registry);    // profile
void add_bench_command(CLI::App& app, Registry& registry);      // bench
void add_simulate_command(CLI::App& app, Registry& registry);   // simulate

// The default tokenizer folder (GPT-2's vocab.json + merges.txt), used by init-model.
std::string default_tokenizer_dir();

// Flag checks with plain messages ("must be > 0, got 0"; CLI11 2.1's own
// PositiveNumber prints its range as a 300-digit number). Finite numbers only.
const CLI::Validator& positive_number();
const CLI::Validator& non_negative_number();

// "1,2,3" -> ids; throws std::invalid_argument naming the bad item.
std::vector<int32_t> parse_id_list(const std::string& text);

// The logit flags of one job: --presence-penalty, --frequency-penalty,
// --repetition-penalty and --logit-bias ID=BIAS (repeatable; turned into
// pairs by parse_logit_bias).
void add_logit_flags(CLI::App* sub, float& presence, float& frequency, float& repetition,
                     std::vector<std::string>& bias);
// {"50256=-100", "11=2.5"} -> (id, bias) pairs; throws std::invalid_argument
// naming the bad item. Ranges and the vocabulary are the router's check.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const std::vector<std::string>& items);

}  // namespace troupe::cli
