// troupe perplexity: a text's perplexity under the model (model/perplexity.hpp),
// with a progress bar on a terminal and --json for scripts.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "model/cpu_features.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/perplexity.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;

struct PerplexityFlags {
  std::string model, file, device = "cpu";
  int64_t context = 0, stride = 0, batch = 128;
  bool score_second_half = false, json = false;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("--file " + path + ": cannot read it");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// "[#########-----------]  45%  9/20 windows" on one line, redrawn in place.
void draw_progress(int64_t done, int64_t total) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::fprintf(stderr, "\r[%s%s] %3d%%  %lld/%lld windows", std::string(filled, '#').c_str(),
               std::string(kWidth - filled, '-').c_str(), total > 0 ? static_cast<int>(100 * done / total) : 100,
               static_cast<long long>(done), static_cast<long long>(total));
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

int run_perplexity(const PerplexityFlags& f) {
  const torch::Device device = parse_device(f.device);
  auto dir = model::load_model_dir(f.model);
  const std::vector<int32_t> ids = dir.tokenizer.encode(read_text(f.file));
  model::PerplexityOptions o;
  o.context = f.context;  // 0 (unset): the model's positions; stride 0: the context
  o.stride = f.stride;
  o.chunk = f.batch;
  o.score_second_half = f.score_second_half;
  o = model::with_defaults(o, dir.config.n_positions);
  model::perplexity_windows(static_cast<int64_t>(ids.size()), o);  // bad options fail before the model loads
  const bool random = dir.config.random_weights;
  model::Gpt2 gpt(dir.config, std::move(dir.weights), device);
  const bool bar = !f.json && isatty(STDERR_FILENO);
  const model::PerplexityResult r =
      model::score_perplexity(gpt, ids, o, bar ? draw_progress : std::function<void(int64_t, int64_t)>());
  const double run_per_s = r.seconds > 0 ? static_cast<double>(r.run) / r.seconds : 0.0;
  const double scored_per_s = r.seconds > 0 ? static_cast<double>(r.scored) / r.seconds : 0.0;
  const char* convention = f.score_second_half ? "second_half" : "sliding";
  if (f.json) {
    json j{{"ppl", r.ppl()},
           {"mean_nll", r.mean_nll()},
           {"nll", r.nll},
           {"text_tokens", ids.size()},
           {"tokens_scored", r.scored},
           {"tokens_run", r.run},
           {"windows", r.windows},
           {"context", o.context},
           {"stride", o.stride},
           {"windows_convention", convention},
           {"seconds", r.seconds},
           {"tokens_per_s", run_per_s},
           {"scored_per_s", scored_per_s},
           {"random_weights", random},
           {"cpu", model::cpu_model_name()},
           {"kernels", model::to_string(model::kernel_isa())}};
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::printf("perplexity %.4f  (mean NLL %.6f nats)\n", r.ppl(), r.mean_nll());
  std::printf("%lld of the text's %zu tokens scored, in %lld windows of %lld (%s, stride %lld); %lld tokens run\n",
              static_cast<long long>(r.scored), ids.size(), static_cast<long long>(r.windows),
              static_cast<long long>(o.context), convention, static_cast<long long>(o.stride),
              static_cast<long long>(r.run));
  std::printf("%.1f s: %.0f tokens/s run, %.0f scored/s (%s, kernels %s)\n", r.seconds, run_per_s, scored_per_s,
              model::cpu_model_name().c_str(), model::to_string(model::kernel_isa()));
  if (random) std::printf("note: RANDOM weights (%s): this perplexity measures nothing about language\n", f.model.c_str());
  return 0;
}

}  // namespace

void add_perplexity_command(CLI::App& app, Registry& registry) {
  auto* sub = app.add_subcommand("perplexity", "Perplexity of a text file under the model (sliding windows)");
  auto f = std::make_shared<PerplexityFlags>();
  sub->add_option("--model", f->model, "Model folder (config.json, model.safetensors, vocab.json, merges.txt)")
      ->required();
  sub->add_option("--file", f->file, "The text to score (UTF-8)")->required();
  sub->add_option("--context", f->context, "Tokens per window (default: the model's positions, 1024 for GPT-2)")
      ->check(positive_number());
  sub->add_option("--stride", f->stride,
                  "A window every STRIDE tokens; each scores only what earlier windows did not "
                  "(Hugging Face's method; default: --context, windows end to end)")
      ->check(positive_number());
  sub->add_option("--batch", f->batch, "Rows per forward pass: its logits take BATCH x vocabulary floats (128: 25.7 MB for GPT-2)")
      ->check(positive_number());
  sub->add_flag("--score-second-half", f->score_second_half,
                "llama.cpp's convention (llama-perplexity -c N): windows of exactly --context tokens end to "
                "end, each scoring only its second half");
  sub->add_option("--device", f->device, "Torch device: cpu, cuda, cuda:N");
  sub->add_flag("--json", f->json, "Print one JSON object");
  registry.push_back({sub, [f] { return run_perplexity(*f); }});
}

}  // namespace troupe::cli
