#pragma once
// How cli/ is put together: each command file registers its subcommands and
// the function that runs each once its flags are parsed. Commands parse flags
// into option structs and call the libraries; they hold no logic of their own.
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <c10/core/Device.h>

namespace troupe::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // exit status
};

using Registry = std::vector<Command>;

void add_model_commands(CLI::App& app, Registry& registry);     // init-model, download, tokenize, detokenize
void add_generate_command(CLI::App& app, Registry& registry);   // generate
void add_batch_command(CLI::App& app, Registry& registry);      // batch
void add_perplexity_command(CLI::App& app, Registry& registry);  // perplexity
void add_cluster_commands(CLI::App& app, Registry& registry);   // serve, worker, keygen
void add_submit_commands(CLI::App& app, Registry& registry);    // submit, status
void add_profile_command(CLI::App& app, Registry& registry);    // profile
void add_bench_command(CLI::App& app, Registry& registry);      // bench
void add_simulate_command(CLI::App& app, Registry& registry);   // simulate

// The default tokenizer folder (GPT-2's vocab.json + merges.txt), used by init-model.
std::string default_tokenizer_dir();

// "cpu", "cuda", "cuda:1" -> a device; std::invalid_argument on junk or when CUDA is absent.
c10::Device parse_device(const std::string& text);
// --dtype float32|bfloat16 and --quantization none|int8 (vLLM's flags): the
// weight matrices' storage, into `dtype` as parse_weight_dtype's names
// ("int8" when quantized; with --dtype bfloat16 a usage error).
void add_dtype_flags(CLI::App* sub, std::string& dtype);
// --kv-cache-dtype auto|float32|bfloat16 (vLLM's flag): the KV cache's
// storage; auto = the weights' (model::parse_kv_cache_dtype).
void add_kv_cache_dtype_flag(CLI::App* sub, std::string& kv_cache_dtype);

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
