#include "model/generate.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "model/sampler.hpp"
#include "model/text/stop_matcher.hpp"

namespace troupe::model {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void check_request(const Gpt2Config& cfg, const std::vector<int32_t>& prompt, const GenerateOptions& o) {
  const std::string who = "generate: ";
  if (prompt.empty()) throw std::invalid_argument(who + "the prompt is empty; give at least one token");
  if (o.max_tokens < 1)
    throw std::invalid_argument(who + "max_tokens must be >= 1, got " + std::to_string(o.max_tokens));
  const int64_t total = static_cast<int64_t>(prompt.size()) + o.max_tokens;
  if (total > cfg.n_positions)
    throw std::invalid_argument(who + "prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                                std::to_string(o.max_tokens) + ") = " + std::to_string(total) +
                                " exceeds the model's n_positions = " + std::to_string(cfg.n_positions) +
                                "; shorten the prompt or lower max_tokens");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size)
      throw std::invalid_argument(who + "prompt token " + std::to_string(i) + " = " +
                                  std::to_string(prompt[i]) + " is outside the vocabulary [0, " +
                                  std::to_string(cfg.vocab_size) + ")");
  validate(o.sampling, cfg.vocab_size);
}

}  // namespace

const char* to_string(GenerateMode mode) { return mode == GenerateMode::kNaive ? "naive" : "kv"; }

GenerateResult generate(const Gpt2& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt_ids,
                        const GenerateOptions& options, GenerateMode mode,
                        const std::function<void(const std::string&)>& on_text,
                        std::vector<torch::Tensor>* step_logits) {
  const Gpt2Config& cfg = model.config();
  check_request(cfg, prompt_ids, options);
  StopMatcher stops(options.stop);  // throws on an empty stop string
  IncrementalDecoder decoder(tokenizer);

  GenerateResult r;
  r.prompt_ids = prompt_ids;
  auto emit = [&](const std::string& delta) {
    if (delta.empty()) return;
    r.text += delta;
    if (on_text) on_text(delta);
  };

  const auto t0 = Clock::now();
  auto t_first = t0;
  const int64_t prompt_len = static_cast<int64_t>(prompt_ids.size());
  std::vector<int32_t> seq = prompt_ids;  // the whole sequence so far (kNaive runs it; the sampler counts it)
  ContiguousKv cache;
  if (mode == GenerateMode::kKv) cache = model.make_contiguous_cache(prompt_len + options.max_tokens);
  std::vector<int32_t> feed = prompt_ids;  // kKv: tokens not yet in the cache

  for (int32_t i = 0; i < options.max_tokens; ++i) {
    // kKv computes the LM head for the sampled row only.
    torch::Tensor logits = mode == GenerateMode::kNaive
                               ? model.forward_full(seq)
                               : model.forward_contiguous(feed, cache, LogitRows::kLast);
    const torch::Tensor last = logits.narrow(0, logits.size(0) - 1, 1);  // [1, vocab]
    const SampledToken tok =
        sample_rows(last, {options.sampling}, {prompt_len + i}, {History(seq, prompt_ids.size())})[0];
    if (step_logits) step_logits->push_back(last[0].to(torch::kCPU, torch::kFloat).clone());
    if (i == 0) t_first = Clock::now();
    r.ids.push_back(tok.id);
    if (options.sampling.logprobs >= 0) r.logprobs.push_back(tok);
    seq.push_back(tok.id);
    feed.assign(1, tok.id);

    if (!options.ignore_eos && tok.id == cfg.eos_token_id) {
      r.finish_reason = "eos";
      break;
    }
    emit(stops.push(decoder.push(tok.id)));
    if (stops.matched()) {
      r.finish_reason = "stop";
      break;
    }
  }
  if (r.finish_reason.empty()) r.finish_reason = "length";
  if (r.finish_reason != "stop") {
    // A stop string completed by the decoder's held bytes still cuts the text.
    emit(stops.push(decoder.flush()));
    emit(stops.flush());
  }
  const auto t_end = Clock::now();
  r.prefill_ms = ms_between(t0, t_first);
  r.decode_ms = ms_between(t_first, t_end);
  return r;
}

}  // namespace troupe::model
