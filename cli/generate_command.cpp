// troupe generate: one prompt through the naive, kv or paged loop, streamed;
// --compare runs the loops back to back and prints them side by side.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include <ATen/Context.h>

#include "actors/engine.hpp"
#include "cli/command.hpp"
#include "cli/model_flags.hpp"
#include "model/cpu_features.hpp"
#include "model/generate.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/sampler.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct GenerateFlags {
  std::string model, prompt, prompt_ids, mode = "kv", device = "cpu", dtype = "float32", kv_cache_dtype = "auto";
  int32_t max_tokens = 16;
  float temperature = 0.0f, top_p = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f,
        repetition_penalty = 1.0f;
  int32_t top_k = 0, logprobs = -1;
  std::vector<std::string> logit_bias;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool json = false, compare = false, ignore_eos = false;
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A single request through the paged engine (Scheduler + StepExecutor), with
// a KV pool just big enough for it.
model::GenerateResult generate_paged(const model::Gpt2& gpt, const model::Tokenizer& tok,
                                     const std::vector<int32_t>& prompt, const model::GenerateOptions& opt,
                                     model::KvDtype kv_dtype,
                                     const std::function<void(const std::string&)>& on_text) {
  const auto& cfg = gpt.config();
  int64_t total = static_cast<int64_t>(prompt.size()) + opt.max_tokens;
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (total > cfg.n_positions)
    throw std::invalid_argument("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                                std::to_string(opt.max_tokens) + ") exceeds the model's " +
                                std::to_string(cfg.n_positions) + " positions");
  core::SchedulerOptions so;
  so.block_size = 16;
  so.num_blocks = static_cast<int32_t>((total + so.block_size - 1) / so.block_size) + 1;
  so.max_model_len = cfg.n_positions;
  so.vocab_size = cfg.vocab_size;
  so.eos_id = cfg.eos_token_id;
  so.watermark = 0.0;
  model::PagedKvCache cache(cfg, so.num_blocks, so.block_size, gpt.device(), kv_dtype);
  actors::Engine engine(gpt, cache, &tok, so, model::PagedAttention::kAuto);

  core::Request req;
  req.id = 1;
  req.prompt_ids = prompt;
  req.max_tokens = opt.max_tokens;
  req.sampling = opt.sampling;
  req.seed = opt.sampling.seed;
  req.ignore_eos = opt.ignore_eos;
  if (auto err = engine.submit(req, opt.stop)) throw std::invalid_argument(*err);

  model::GenerateResult r;
  r.prompt_ids = prompt;
  auto t0 = Clock::now();
  bool first = true;
  while (engine.has_unfinished()) {
    if (!engine.step()) throw std::logic_error("paged engine stalled");
    for (auto& ev : engine.take_events()) {
      if (!ev.text_delta.empty() && on_text) on_text(ev.text_delta);
      if (ev.kind == core::EventKind::kScheduled) continue;
      if (!ev.finished()) {
        if (first) {
          r.prefill_ms = ms_since(t0);
          t0 = Clock::now();
          first = false;
        }
        model::SampledToken t;
        t.id = ev.token_id;
        t.logprob = ev.logprob;
        t.top = ev.top_logprobs;
        r.logprobs.push_back(std::move(t));
        continue;
      }
      r.ids = ev.output_ids;
      r.text = ev.text;
      r.finish_reason = core::to_string(ev.finish_reason);
    }
  }
  r.decode_ms = first ? 0.0 : ms_since(t0);
  if (opt.sampling.logprobs < 0) r.logprobs.clear();
  return r;
}

model::GenerateResult run_mode(const std::string& mode, const model::Gpt2& gpt, const model::Tokenizer& tok,
                               const std::vector<int32_t>& prompt, const model::GenerateOptions& opt,
                               model::KvDtype kv_dtype, const std::function<void(const std::string&)>& on_text) {
  if (mode == "naive") return model::generate(gpt, tok, prompt, opt, model::GenerateMode::kNaive, on_text);
  if (mode == "kv") return model::generate(gpt, tok, prompt, opt, model::GenerateMode::kKv, on_text);
  return generate_paged(gpt, tok, prompt, opt, kv_dtype, on_text);
}

double tokens_per_s(const model::GenerateResult& r) {
  double ms = r.prefill_ms + r.decode_ms;
  return ms > 0 ? r.ids.size() * 1000.0 / ms : 0.0;
}

// ms per generated token after the first (the decode loop's pace).
double ms_per_token(const model::GenerateResult& r) {
  return r.ids.size() > 1 ? r.decode_ms / static_cast<double>(r.ids.size() - 1) : 0.0;
}

json to_json(const model::GenerateResult& r, bool with_logprobs) {
  json j{{"prompt_ids", r.prompt_ids},
         {"ids", r.ids},
         {"text", r.text},
         {"finish_reason", r.finish_reason},
         {"timing",
          {{"prefill_ms", r.prefill_ms},
           {"decode_ms", r.decode_ms},
           {"tokens_per_s", tokens_per_s(r)},
           {"cpu", model::cpu_model_name()},
           {"kernels", model::to_string(model::kernel_isa())}}}};
  if (with_logprobs) {
    json lp = json::array();
    for (const auto& t : r.logprobs) {
      json top = json::array();
      for (const auto& [id, p] : t.top) top.push_back({id, p});
      lp.push_back({{"id", t.id}, {"logprob", t.logprob}, {"top", top}});
    }
    j["logprobs"] = lp;
  }
  return j;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int run_generate(const GenerateFlags& f, const CLI::App& sub) {
  if (sub.count("--prompt") == sub.count("--prompt-ids"))
    throw std::invalid_argument("give exactly one of --prompt TEXT or --prompt-ids 1,2,3");
  model::GenerateOptions opt;
  opt.max_tokens = f.max_tokens;
  opt.sampling.temperature = f.temperature;
  opt.sampling.top_k = f.top_k;
  opt.sampling.top_p = f.top_p;
  opt.sampling.seed = f.seed;
  opt.sampling.logprobs = f.logprobs;
  opt.sampling.presence_penalty = f.presence_penalty;
  opt.sampling.frequency_penalty = f.frequency_penalty;
  opt.sampling.repetition_penalty = f.repetition_penalty;
  opt.sampling.logit_bias = core::sorted_logit_bias(parse_logit_bias(f.logit_bias));
  opt.stop = f.stop;
  opt.ignore_eos = f.ignore_eos;
  model::validate(opt.sampling);
  if (opt.max_tokens < 1) throw std::invalid_argument("--max-tokens must be at least 1");
  torch::Device device = parse_device(f.device);

  auto dir = model::load_model_dir(f.model);
  std::vector<int32_t> prompt = f.prompt_ids.empty() ? dir.tokenizer.encode(f.prompt) : parse_id_list(f.prompt_ids);
  for (int32_t id : prompt)
    if (id >= dir.config.vocab_size)
      throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary (" +
                                  std::to_string(dir.config.vocab_size) + ")");
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) + opt.max_tokens > dir.config.n_positions)
    throw std::invalid_argument("prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens (" +
                                std::to_string(opt.max_tokens) + ") exceeds the model's " +
                                std::to_string(dir.config.n_positions) + " positions");
  const model::WeightDtype dtype = model::parse_weight_dtype(f.dtype);
  const model::KvDtype kv_dtype = model::parse_kv_cache_dtype(f.kv_cache_dtype, dtype);
  if (sub.count("--kv-cache-dtype") && kv_dtype != model::KvDtype::kFloat32 && (f.mode != "paged" || f.compare))
    throw std::invalid_argument("--kv-cache-dtype " + f.kv_cache_dtype +
                                " is the paged cache's: give --mode paged (without --compare)");
  model::Gpt2 gpt(dir.config, std::move(dir.weights), device, dtype);

  auto stream = [&](const std::string& delta) {
    if (f.json) return;
    std::fwrite(delta.data(), 1, delta.size(), stdout);
    std::fflush(stdout);
  };

  if (!f.compare) {
    auto r = run_mode(f.mode, gpt, dir.tokenizer, prompt, opt, kv_dtype, stream);
    if (f.json) {
      std::cout << dump(to_json(r, f.logprobs >= 0)) << std::endl;
    } else {
      std::fprintf(stderr, "\n[%s] prefill %.1f ms | %.2f ms/token | %.1f tokens/s | %zu tokens | finish: %s\n",
                   f.mode.c_str(), r.prefill_ms, ms_per_token(r), tokens_per_s(r), r.ids.size(),
                   r.finish_reason.c_str());
    }
    return 0;
  }

  // --compare: the same prompt and options through every loop.
  std::vector<std::pair<std::string, model::GenerateResult>> runs;
  for (const char* mode : {"naive", "kv", "paged"}) {
    if (!f.json) std::printf("\n== %s ==\n%s", mode, f.prompt.empty() ? "" : f.prompt.c_str());
    // The loops must agree: one KV storage for all (the kv loop's is fp32).
    runs.emplace_back(mode, run_mode(mode, gpt, dir.tokenizer, prompt, opt, model::KvDtype::kFloat32, stream));
    if (!f.json) std::printf("\n");
  }
  const auto& naive = runs[0].second;
  bool same = true;
  for (const auto& [m, r] : runs) same = same && r.ids == naive.ids;
  double naive_total = naive.prefill_ms + naive.decode_ms;
  if (f.json) {
    json j;
    for (const auto& [m, r] : runs) j[m] = to_json(r, f.logprobs >= 0);
    j["same_tokens"] = same;
    std::cout << dump(j) << std::endl;
    return 0;
  }
  std::printf("\n%-6s %7s %11s %11s %11s %10s %11s %9s\n", "mode", "tokens", "prefill ms", "decode ms",
              "total ms", "ms/token", "tokens/s", "speed-up");
  for (const auto& [m, r] : runs) {
    double total = r.prefill_ms + r.decode_ms;
    std::printf("%-6s %7zu %11.1f %11.1f %11.1f %10.2f %11.1f %8.2fx\n", m.c_str(), r.ids.size(), r.prefill_ms,
                r.decode_ms, total, ms_per_token(r), tokens_per_s(r), total > 0 ? naive_total / total : 0.0);
  }
  std::printf("same tokens in every mode: %s   (speed-up = naive total time / mode total time)\n",
              same ? "yes" : "NO");
  if (dir.config.random_weights) std::printf("note: RANDOM weights (%s): the text above is noise\n", f.model.c_str());
  return 0;
}

}  // namespace

c10::Device parse_device(const std::string& text) {
  std::optional<c10::Device> device;
  try {
    device.emplace(text);
  } catch (const c10::Error&) {
    throw std::invalid_argument("'" + text + "' is not a torch device (cpu, cuda, cuda:N)");
  }
  if (device->is_cuda() && !at::hasCUDA())
    throw std::invalid_argument("device '" + text + "': this build or machine has no CUDA");
  return *device;
}

void add_dtype_flags(CLI::App* sub, std::string& dtype) {
  CLI::Option* d =
      sub->add_option("--dtype", dtype,
                      "Weights stored as float32 (default) or bfloat16 (half the bytes per step; fp32 "
                      "math on the rounded weights)")
          ->check(CLI::IsMember({"float32", "bfloat16", "fp32", "bf16"}));
  // Added after --dtype, so CLI11 runs this callback after --dtype's value is in `dtype`.
  sub->add_option_function<std::string>(
         "--quantization",
         [&dtype, d](const std::string& q) {
           if (q == "none") return;
           if (d->count() > 0 && dtype != "float32" && dtype != "fp32")
             throw CLI::ValidationError("--quantization " + q,
                                        "int8 weights widen to fp32, not to --dtype " + dtype +
                                            ": drop --dtype (or give --dtype float32)");
           dtype = q;
         },
         "int8: weight matrices as symmetric int8 with an fp32 scale per output channel (a quarter of "
         "float32's bytes per step; fp32 math on the dequantized weights); int8_g32: a scale per group of 32 "
         "inputs instead (llama.cpp Q8_0's blocks, fp32 scales: 1.125 bytes a weight); none (default): as "
         "--dtype. Refused with --dtype bfloat16")
      ->check(CLI::IsMember({"none", "int8", "int8_g32"}));
}

void add_kv_cache_dtype_flag(CLI::App* sub, std::string& kv_cache_dtype) {
  sub->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "KV cache stored as auto (default: bfloat16 with --dtype bfloat16, else float32), float32 or "
                  "bfloat16 (half the bytes: twice the tokens in the same --kv-memory, half the K/V a decode "
                  "step reads)")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "fp32", "bf16"}));
}

void add_generate_command(CLI::App& app, Registry& registry) {
  auto* sub = app.add_subcommand("generate", "Generate text for one prompt (naive, kv or paged loop)");
  auto f = std::make_shared<GenerateFlags>();
  sub->add_option("--model", f->model, "Model folder (config.json, model.safetensors, vocab.json, merges.txt)")
      ->required();
  sub->add_option("--prompt", f->prompt, "Prompt text");
  sub->add_option("--prompt-ids", f->prompt_ids, "Prompt as token ids, e.g. 15496,995");
  sub->add_option("--max-tokens", f->max_tokens, "Tokens to generate at most")->check(positive_number());
  sub->add_option("--mode", f->mode,
                  "naive: recompute everything each step, O(N^2); kv: contiguous KV cache, O(N); "
                  "paged: the serving engine (paged KV, scheduler)")
      ->check(CLI::IsMember({"naive", "kv", "paged"}));
  sub->add_option("--temperature", f->temperature, "0 = greedy")->check(non_negative_number());
  sub->add_option("--top-k", f->top_k, "Keep the k most likely tokens (0 = off)")
      ->check(non_negative_number());
  sub->add_option("--top-p", f->top_p, "Nucleus sampling mass in (0, 1] (1 = off)")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--seed", f->seed, "Random seed (same seed, same text)");
  sub->add_option("--stop", f->stop, "Stop string (repeatable); the text ends before it");
  sub->add_option("--logprobs", f->logprobs, "Return logprobs of each token and its top K alternatives (0-20)")
      ->check(CLI::Range(0, 20));
  add_logit_flags(sub, f->presence_penalty, f->frequency_penalty, f->repetition_penalty, f->logit_bias);
  sub->add_flag("--ignore-eos", f->ignore_eos, "Keep going after <|endoftext|>");
  sub->add_option("--device", f->device, "Torch device: cpu, cuda, cuda:N");
  add_dtype_flags(sub, f->dtype);
  add_kv_cache_dtype_flag(sub, f->kv_cache_dtype);
  sub->add_flag("--json", f->json, "Print one JSON object instead of streaming text");
  sub->add_flag("--compare", f->compare, "Run naive, kv and paged back to back and compare them");
  registry.push_back({sub, [f, sub] { return run_generate(*f, *sub); }});
}

}  // namespace troupe::cli
