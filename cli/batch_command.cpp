// troupe batch: an offline JSONL file of jobs through the paged engine.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "actors/router/router_core.hpp"
#include "cli/command.hpp"
#include "cli/job_json.hpp"
#include "cli/model_flags.hpp"
#include "cli/scheduler_flags.hpp"
#include "cluster/http/json_input.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/sampler.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BatchFlags {
  std::string model, input, output, device = "cpu", dtype = "float32", kv_cache_dtype = "auto";
  SchedulerFlags sched;
  bool quiet = false;
};

// One input line, turned into a request (or the reason it cannot be one).
struct Job {
  json id;                    // echoed back as given (line number when absent)
  std::optional<core::Request> request;
  JobLine line;                                 // the job as read (stop strings, logprobs, echo, ...)
  std::vector<core::SampledToken> prompt_scores;  // prompt logprobs as they come
  json output;                // the finished output line
  bool done = false;
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

class Progress {
 public:
  Progress(size_t total, bool quiet) : total_(total), quiet_(quiet), tty_(isatty(STDERR_FILENO)) {}
  void update(size_t done, int64_t tokens, double seconds, bool force = false) {
    if (quiet_) return;
    auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(tty_ ? 200 : 5000)) return;
    last_ = now;
    const int width = 30;
    int fill = total_ ? static_cast<int>(width * done / total_) : width;
    std::string bar(fill, '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "%s[%s] %zu/%zu requests | %lld tokens | %.1f tok/s%s", tty_ ? "\r" : "", bar.c_str(), done,
                 total_, static_cast<long long>(tokens), seconds > 0 ? tokens / seconds : 0.0, tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void finish() {
    if (!quiet_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  size_t total_;
  bool quiet_, tty_;
  Clock::time_point last_{};
};

int run_batch(const BatchFlags& f) {
  c10::Device device = parse_device(f.device);
  std::ifstream in(f.input);
  if (!in) throw std::invalid_argument("cannot read --input '" + f.input + "'");
  std::ofstream out(f.output);
  if (!out) throw std::invalid_argument("cannot write --output '" + f.output + "'");

  auto dir = model::load_model_dir(f.model);
  const auto& cfg = dir.config;
  const model::WeightDtype dtype = model::parse_weight_dtype(f.dtype);
  const model::KvDtype kv_dtype = model::parse_kv_cache_dtype(f.kv_cache_dtype, dtype);
  const core::SchedulerOptions so = scheduler_options(f.sched, cfg, kv_dtype);
  model::Gpt2 gpt(cfg, std::move(dir.weights), device, dtype);
  model::PagedKvCache cache(cfg, so.num_blocks, so.block_size, device, kv_dtype);
  actors::Engine engine(gpt, cache, &dir.tokenizer, so, model::PagedAttention::kAuto);
  actors::RouterOptions router_options;  // the servers' job checks, without a queue bound
  router_options.max_model_len = cfg.n_positions;
  router_options.vocab_size = cfg.vocab_size;
  router_options.eos_id = cfg.eos_token_id;

  // Read and submit every line; bad lines get their error output at once.
  std::vector<Job> jobs;
  std::string line;
  size_t failed = 0;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Job job;
    job.id = jobs.size() + 1;
    try {
      json j = cluster::parse_json_input(line);
      if (j.is_object() && j.contains("id")) job.id = j["id"];
      job.line = parse_job_line(j);
      const transport::Submit& submit = job.line.job;
      auto admitted = actors::admit_job(submit, dir.tokenizer, router_options);
      if (auto* rej = std::get_if<actors::Rejected>(&admitted)) throw std::invalid_argument(rej->message);
      core::Request r = std::move(std::get<core::Request>(admitted));
      r.id = jobs.size();
      if (auto err = engine.submit(r, submit.stop)) throw std::invalid_argument(*err);
      // Kept only for the output: the prompt's ids (in the request) when the
      // output shows the prompt, its text when an echo does.
      if (!job.line.echo && job.line.prompt_logprobs < 0) r.prompt_ids.clear();
      job.line.job.prompt_ids.reset();
      if (!job.line.echo) job.line.job.prompt.reset();
      job.request = std::move(r);
    } catch (const std::exception& e) {
      job.output = json{{"id", job.id}, {"error", e.what()}};
      job.done = true;
      ++failed;
    }
    jobs.push_back(std::move(job));
  }

  Progress progress(jobs.size(), f.quiet);
  size_t done = failed, written = 0;
  int64_t out_tokens = 0, prompt_tokens = 0;
  auto t0 = Clock::now();
  auto flush_ready = [&] {
    while (written < jobs.size() && jobs[written].done) out << dump(jobs[written++].output) << '\n';
    out.flush();
  };
  flush_ready();
  while (engine.has_unfinished()) {
    if (!engine.step())
      throw std::runtime_error("the engine cannot schedule the waiting requests (KV pool too small?)");
    for (auto& ev : engine.take_events()) {
      Job& job = jobs.at(ev.request_id);
      if (ev.kind == core::EventKind::kScheduled) continue;
      if (ev.kind == core::EventKind::kPromptLogprobs) {
        job.prompt_scores.insert(job.prompt_scores.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
        continue;
      }
      if (!ev.finished()) {
        if (job.line.job.logprobs >= 0) {
          json top = json::array();
          for (const auto& [id, p] : ev.top_logprobs) top.push_back({id, p});
          job.output["logprobs"].push_back({{"id", ev.token_id}, {"logprob", ev.logprob}, {"top", top}});
        }
        continue;
      }
      json o{{"id", job.id},
             {"ids", ev.output_ids},
             {"text", ev.text},
             {"finish_reason", core::to_string(ev.finish_reason)},
             {"usage",
              {{"prompt_tokens", ev.usage.prompt_tokens},
               {"completion_tokens", ev.usage.completion_tokens},
               {"cached_tokens", ev.usage.cached_tokens}}}};
      if (ev.finish_reason == core::FinishReason::kError) {
        o["error"] = ev.error;
        ++failed;
      }
      if (job.line.job.logprobs >= 0)  // none generated (max_tokens 0): no token's logprobs came
        o["logprobs"] = job.output.is_object() ? job.output.value("logprobs", json::array()) : json::array();
      if (job.line.echo || job.line.prompt_logprobs >= 0) {
        const auto& ids = job.request->prompt_ids;
        add_prompt_output(o, job.line, ids, job.line.job.prompt ? *job.line.job.prompt : dir.tokenizer.decode(ids),
                          job.prompt_scores);
      }
      job.output = std::move(o);
      job.done = true;
      ++done;
      out_tokens += ev.usage.completion_tokens;
      prompt_tokens += ev.usage.prompt_tokens;
    }
    flush_ready();
    progress.update(done, out_tokens, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  progress.update(done, out_tokens, secs, true);
  progress.finish();
  flush_ready();

  auto st = engine.scheduler().stats();
  const auto& es = engine.stats();
  std::fprintf(stderr,
               "requests: %zu (%zu ok, %zu failed) | prompt tokens: %lld | output tokens: %lld | %.2f s | "
               "%.1f output tok/s\n"
               "steps: %lld | KV: %d blocks x %d, mean utilisation %.1f%% | preemptions: %lld | "
               "prefix cache: %lld/%lld prompt tokens hit (%.1f%%) | scheduling %.2f%% of model time\n",
               jobs.size(), jobs.size() - failed, failed, static_cast<long long>(prompt_tokens),
               static_cast<long long>(out_tokens), secs, secs > 0 ? out_tokens / secs : 0.0,
               static_cast<long long>(es.steps), so.num_blocks, so.block_size, 100.0 * es.mean_kv_utilization(),
               static_cast<long long>(st.preemptions), static_cast<long long>(st.prefix_hit_tokens),
               static_cast<long long>(st.prefix_query_tokens),
               st.prefix_query_tokens ? 100.0 * st.prefix_hit_tokens / st.prefix_query_tokens : 0.0,
               es.forward_ms > 0 ? 100.0 * es.schedule_ms / es.forward_ms : 0.0);
  // Every line has its output line (a failed job's names its error); the
  // status says whether any failed, as `troupe submit`'s does.
  return failed == 0 ? 0 : 1;
}

}  // namespace

void add_batch_command(CLI::App& app, Registry& registry) {
  auto* sub = app.add_subcommand("batch", "Run a JSONL file of jobs offline through the paged engine");
  auto f = std::make_shared<BatchFlags>();
  sub->add_option("--model", f->model, "Model folder")->required();
  sub->add_option(
         "--input", f->input,
         "JSONL jobs: {\"id\", \"prompt\" | \"prompt_ids\", \"max_tokens\", \"temperature\", \"top_k\", "
         "\"top_p\", \"seed\", \"stop\", \"logprobs\", \"ignore_eos\", \"presence_penalty\", "
         "\"frequency_penalty\", \"logit_bias\", \"repetition_penalty\", \"priority\", \"echo\", "
         "\"prompt_logprobs\"}")
      ->required();
  sub->add_option("--output", f->output, "JSONL results, one line per input line, in input order")->required();
  add_scheduler_flags(*sub, f->sched);
  sub->add_option("--device", f->device, "Torch device: cpu, cuda, cuda:N");
  add_dtype_flags(sub, f->dtype);
  add_kv_cache_dtype_flag(sub, f->kv_cache_dtype);
  sub->add_flag("--quiet", f->quiet, "No progress bar");
  registry.push_back({sub, [f] { return run_batch(*f); }});
}

}  // namespace troupe::cli
