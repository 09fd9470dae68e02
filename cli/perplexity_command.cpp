// troupe perplexity: a text's perplexity under the model (model/perplexity.hpp),
// with a progress bar on a terminal and --json for scripts.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/model_flags.hpp"
#include "cluster/loadgen/remote_scoring.hpp"
#include "model/cpu_features.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/perplexity.hpp"
#include "model/text/tokenizer.hpp"
#include "transport/curve_keys.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;

struct PerplexityFlags {
  std::string model, file, device = "cpu", dtype = "float32", kv_cache_dtype = "auto";
  int64_t context = 0, stride = 0, batch = 128;
  bool score_second_half = false, json = false, kl_divergence = false;
  // Through a running server instead of a model loaded here.
  std::string to, base_url, api_key, served_model, server_key, secret_key;
  int32_t max_in_flight = 16;
  double timeout_s = 300;
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

// The windows scored by a running server (--to: troupe's head; --base-url:
// any OpenAI-compatible server), the model folder giving only the tokenizer
// and the positions.
model::PerplexityResult score_remotely(const PerplexityFlags& f, const std::vector<int32_t>& ids,
                                       const std::vector<model::PerplexityWindow>& windows,
                                       const std::function<void(int64_t, int64_t)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> jobs;
  for (const auto& w : windows) jobs.emplace_back(ids.begin() + w.begin, ids.begin() + w.end);
  cluster::RemoteScoring rs;
  rs.max_in_flight = f.max_in_flight;
  rs.timeout = std::chrono::seconds(static_cast<int64_t>(std::ceil(f.timeout_s)));
  rs.progress = progress;
  std::vector<std::vector<float>> lp;
  if (!f.to.empty()) {
    cluster::ClientOptions co;
    co.endpoint = f.to;
    co.curve = transport::client_keys(f.secret_key, f.server_key);
    lp = cluster::score_windows(co, jobs, rs);
  } else {
    lp = cluster::score_windows_http(f.base_url, f.api_key, f.served_model, jobs, rs);
  }
  model::PerplexityResult r;
  for (size_t i = 0; i < windows.size(); ++i) model::add_window(r, windows[i], lp[i]);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// --kl-divergence: the --dtype / --quantization model (its KV cache in
// o.kv_dtype) against the float32 one (float32 KV) on the same windows
// (llama-perplexity --kl-divergence's figures).
int run_kl_divergence(const PerplexityFlags& f, model::ModelDir& dir, const std::vector<int32_t>& ids,
                      const model::PerplexityOptions& o, const std::function<void(int64_t, int64_t)>& progress,
                      model::WeightDtype dtype) {
  const torch::Device device = parse_device(f.device);
  const model::Gpt2 base(dir.config, dir.weights, device, model::WeightDtype::kFloat32);
  const model::Gpt2 gpt(dir.config, std::move(dir.weights), device, dtype);
  const model::KlResult k = model::score_kl_divergence(base, gpt, ids, o, progress);
  const std::string what = std::string(model::to_string(dtype)) + " weights, " + model::to_string(o.kv_dtype) + " KV";
  if (f.json) {
    json j{{"dtype", model::to_string(dtype)},
           {"kv_cache_dtype", model::to_string(o.kv_dtype)},
           {"kl_mean", k.kl_mean},
           {"kl_p99", k.kl_p99},
           {"kl_max", k.kl_max},
           {"top1_agreement", k.top1},
           {"ppl", k.model.ppl()},
           {"ppl_float32", k.base.ppl()},
           {"tokens_scored", k.model.scored},
           {"windows", k.model.windows},
           {"context", o.context},
           {"stride", o.stride},
           {"windows_convention", f.score_second_half ? "second_half" : "sliding"},
           {"seconds", k.model.seconds},
           {"random_weights", dir.config.random_weights},
           {"cpu", model::cpu_model_name()},
           {"kernels", model::to_string(model::kernel_isa())}};
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::printf("%s against float32, %lld tokens scored in %lld windows of %lld:\n", what.c_str(),
              static_cast<long long>(k.model.scored), static_cast<long long>(k.model.windows),
              static_cast<long long>(o.context));
  std::printf("  KL divergence: mean %.6g, p99 %.6g, max %.6g nats\n", k.kl_mean, k.kl_p99, k.kl_max);
  std::printf("  top-1 agreement: %.4f%%\n", 100.0 * k.top1);
  std::printf("  perplexity: %s %.4f, float32 %.4f\n", model::to_string(dtype), k.model.ppl(), k.base.ppl());
  if (dir.config.random_weights)
    std::printf("note: RANDOM weights (%s): these figures measure the rounding, not language\n", f.model.c_str());
  return 0;
}

int run_perplexity(const PerplexityFlags& f) {
  const bool remote = !f.to.empty() || !f.base_url.empty();
  if (remote && f.score_second_half)
    throw std::invalid_argument("--score-second-half scores half a window's rows: it is local only");
  // Remotely the model folder gives the tokenizer and the positions; no weights are loaded.
  std::optional<model::ModelDir> dir;
  std::optional<model::Tokenizer> tokenizer;
  model::Gpt2Config config;
  if (remote) {
    tokenizer.emplace(model::Tokenizer::from_dir(f.model));
    config = model::Gpt2Config::from_json_file(f.model + "/config.json");
  } else {
    dir.emplace(model::load_model_dir(f.model));
    config = dir->config;
  }
  const std::vector<int32_t> ids = (remote ? *tokenizer : dir->tokenizer).encode(read_text(f.file));
  model::PerplexityOptions o;
  o.context = f.context;  // 0 (unset): the model's positions; stride 0: the context
  o.stride = f.stride;
  o.chunk = f.batch;
  o.score_second_half = f.score_second_half;
  o = model::with_defaults(o, config.n_positions);
  // Bad options fail before the model loads.
  const std::vector<model::PerplexityWindow> windows = model::perplexity_windows(static_cast<int64_t>(ids.size()), o);
  const bool random = config.random_weights;
  const bool bar = !f.json && isatty(STDERR_FILENO);
  const std::function<void(int64_t, int64_t)> progress = bar ? draw_progress : std::function<void(int64_t, int64_t)>();
  const model::WeightDtype dtype = model::parse_weight_dtype(f.dtype);
  o.kv_dtype = model::parse_kv_cache_dtype(f.kv_cache_dtype, dtype);
  if (remote && f.kv_cache_dtype != "auto")
    throw std::invalid_argument("--kv-cache-dtype is the server's when scoring through one (give it to serve)");
  if (f.kl_divergence) {
    if (remote) throw std::invalid_argument("--kl-divergence runs both models here: it takes no --to or --base-url");
    if (dtype == model::WeightDtype::kFloat32 && o.kv_dtype == model::KvDtype::kFloat32)
      throw std::invalid_argument(
          "--kl-divergence compares the --dtype, --quantization or --kv-cache-dtype model with the float32 "
          "one: give --dtype bfloat16, --quantization int8 or --kv-cache-dtype bfloat16");
    return run_kl_divergence(f, *dir, ids, o, progress, dtype);
  }
  model::PerplexityResult r;
  if (remote) {
    r = score_remotely(f, ids, windows, progress);
  } else {
    model::Gpt2 gpt(dir->config, std::move(dir->weights), parse_device(f.device), dtype);
    r = model::score_perplexity(gpt, ids, o, progress);
  }
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
           {"scored_by", !f.to.empty() ? f.to : !f.base_url.empty() ? f.base_url : "local"}};
    if (!remote) {
      j["cpu"] = model::cpu_model_name();
      j["kernels"] = model::to_string(model::kernel_isa());
    }
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::printf("perplexity %.4f  (mean NLL %.6f nats)\n", r.ppl(), r.mean_nll());
  std::printf("%lld of the text's %zu tokens scored, in %lld windows of %lld (%s, stride %lld); %lld tokens run\n",
              static_cast<long long>(r.scored), ids.size(), static_cast<long long>(r.windows),
              static_cast<long long>(o.context), convention, static_cast<long long>(o.stride),
              static_cast<long long>(r.run));
  if (remote)
    std::printf("%.1f s: %.0f tokens/s run, %.0f scored/s (scored by %s)\n", r.seconds, run_per_s, scored_per_s,
                (!f.to.empty() ? f.to : f.base_url).c_str());
  else
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
  add_dtype_flags(sub, f->dtype);
  add_kv_cache_dtype_flag(sub, f->kv_cache_dtype);
  sub->add_flag("--kl-divergence", f->kl_divergence,
                "Compare the --dtype, --quantization or --kv-cache-dtype model with the float32 one (both "
                "loaded here): mean and p99 KL divergence of the next-token distributions and top-1 "
                "agreement, as llama-perplexity --kl-divergence");
  sub->add_flag("--json", f->json, "Print one JSON object");
  auto* to = sub->add_option("--to", f->to,
                             "Score through a running troupe head (its client endpoint, tcp://HOST:5555): "
                             "--model then gives only the tokenizer and the positions");
  auto* url = sub->add_option("--base-url", f->base_url,
                              "Score through an OpenAI-compatible server (http://HOST:PORT): each window is a "
                              "completion with echo, logprobs 0, max_tokens 0");
  to->excludes(url);
  sub->add_option("--api-key", f->api_key, "--base-url: the server's API key (Bearer)");
  sub->add_option("--served-model", f->served_model, "--base-url: the model name to send (default: none)");
  sub->add_option("--curve-server-key", f->server_key, "--to: CurveZMQ, the head's public key (or its .pub file)");
  sub->add_option("--curve-secret-key", f->secret_key, "--to: CurveZMQ, this client's secret key file");
  sub->add_option("--max-in-flight", f->max_in_flight, "--to / --base-url: windows scored at once")
      ->check(positive_number());
  sub->add_option("--timeout", f->timeout_s, "--to / --base-url: seconds of silence before giving up")
      ->check(positive_number());
  registry.push_back({sub, [f] { return run_perplexity(*f); }});
}

}  // namespace troupe::cli
