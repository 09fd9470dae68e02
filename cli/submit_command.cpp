// troupe submit | status: a client of a running head.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/job_json.hpp"
#include "cluster/http/json_input.hpp"
#include "cluster/client.hpp"
#include "core/request.hpp"
#include "transport/curve_keys.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ClientFlags {
  std::string to = "tcp://127.0.0.1:5555", server_key, secret_key;
  double timeout_s = 120;  // silence from the head after which the client gives up
};

void add_client_flags(CLI::App* sub, ClientFlags& f) {
  sub->add_option("--to", f.to, "The head's client endpoint");
  sub->add_option("--curve-server-key", f.server_key, "CurveZMQ: the head's public key (or its .pub file)");
  sub->add_option("--curve-secret-key", f.secret_key,
                  "CurveZMQ: this client's secret key file (troupe keygen)");
  sub->add_option("--timeout", f.timeout_s, "Seconds of silence from the head before giving up")
      ->check(positive_number());
}

cluster::ClientOptions client_options(const ClientFlags& f) {
  cluster::ClientOptions o;
  o.endpoint = f.to;
  o.curve = transport::client_keys(f.secret_key, f.server_key);
  return o;
}

std::chrono::milliseconds timeout_of(const ClientFlags& f) {
  return std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// One job's result as a JSON line (the format of `troupe batch`, plus timings).
struct Outcome {
  json id;
  std::string text;
  std::vector<int32_t> ids;
  json logprobs = json::array();
  JobLine job;              // echo, prompt_logprobs
  transport::Tokens prompt;  // a job with prompt_logprobs: the router's Tokens with its prompt and scores
  std::optional<transport::Finished> finished;
  std::optional<std::string> error;  // rejected, or failed before finishing
  int busy_retries = 0;
  double client_ttft_ms = -1;        // measured here: sent -> first tokens (single-prompt form)

  bool ok() const { return finished && finished->finish_reason != core::FinishReason::kError && !error; }
  json line() const {
    if (error) return json{{"id", id}, {"error", *error}};
    json o{{"id", id},
           {"ids", ids},
           {"text", text},
           {"finish_reason", core::to_string(finished->finish_reason)},
           {"usage",
            {{"prompt_tokens", finished->usage.prompt_tokens},
             {"completion_tokens", finished->usage.completion_tokens},
             {"cached_tokens", finished->usage.cached_tokens}}},
           {"timings",
            {{"queue_ms", finished->timings.queue_ms},
             {"ttft_ms", finished->timings.ttft_ms},
             {"e2e_ms", finished->timings.e2e_ms}}}};
    if (client_ttft_ms >= 0) o["timings"]["client_ttft_ms"] = client_ttft_ms;
    if (finished->finish_reason == core::FinishReason::kError) o["error"] = finished->error;
    if (!logprobs.empty()) o["logprobs"] = logprobs;
    if (job.echo || job.prompt_logprobs >= 0)
      add_prompt_output(o, job, prompt.prompt_ids, prompt.prompt_text, prompt.prompt_logprobs);
    return o;
  }
  // Applies one message about this job; true when it is the last one.
  bool apply(const transport::Message& m) {
    if (auto* t = std::get_if<transport::Tokens>(&m)) {
      if (!t->prompt_ids.empty()) prompt = *t;
      text += t->text;
      ids.insert(ids.end(), t->ids.begin(), t->ids.end());
      for (size_t i = 0; i < t->logprobs.size() && i < t->ids.size(); ++i) {
        json top = json::array();
        for (const auto& [tid, lp] : t->logprobs[i].top) top.push_back({tid, lp});
        logprobs.push_back({{"id", t->ids[i]}, {"logprob", t->logprobs[i].logprob}, {"top", top}});
      }
      return false;
    }
    if (auto* f = std::get_if<transport::Finished>(&m)) {
      text += f->text;
      finished = *f;
      return true;
    }
    if (auto* r = std::get_if<transport::Rejected>(&m)) {
      error = std::string(transport::to_string(r->code)) + ": " + r->message;
      return true;
    }
    if (auto* e = std::get_if<transport::Error>(&m)) {
      error = std::string(transport::to_string(e->code)) + ": " + e->message;
      return true;
    }
    return false;
  }
};

// An error without a tag is about the connection (the head cut this client
// off, a failed handshake): it ends every open job.
const transport::Error* connection_error(const transport::Message& m) {
  const auto* e = std::get_if<transport::Error>(&m);
  return e && !e->tag ? e : nullptr;
}

std::optional<uint64_t> tag_of(const transport::Message& m) {
  return std::visit(
      [](const auto& x) -> std::optional<uint64_t> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, transport::Error>) {
          return x.tag;
        } else if constexpr (std::is_same_v<T, transport::Accepted> ||
                             std::is_same_v<T, transport::Rejected> || std::is_same_v<T, transport::Tokens> ||
                             std::is_same_v<T, transport::Finished>) {
          return x.tag;
        } else {
          return std::nullopt;
        }
      },
      m);
}

struct SubmitFlags {
  ClientFlags client;
  std::string prompt, input, output;
  transport::Submit job;  // sampling flags of the single-prompt form
  std::vector<std::string> logit_bias;
  int32_t max_in_flight = 0;
  bool json_out = false, quiet = false;
};

int submit_one(const SubmitFlags& f) {
  cluster::Client client(client_options(f.client));
  transport::Submit job = f.job;
  job.tag = 1;
  job.prompt = f.prompt;
  Outcome out;
  const auto silence = timeout_of(f.client);
  for (;;) {
    const auto sent = Clock::now();
    if (!client.send(job)) throw std::runtime_error("cannot send to " + f.client.to);
    bool done = false, busy = false;
    while (!done) {
      auto m = client.next(silence);
      if (!m)
        throw std::runtime_error("no answer from the head at " + f.client.to + " for " +
                                 seconds_text(f.client.timeout_s) + " s (is `troupe serve` running?)");
      if (connection_error(*m)) {
        out.apply(*m);
        break;
      }
      if (tag_of(*m) != std::optional<uint64_t>(1)) continue;
      if (auto* r = std::get_if<transport::Rejected>(&*m);
          r && r->code == transport::RejectCode::kBusy && out.busy_retries < 100) {
        busy = true;
        break;
      }
      if (auto* t = std::get_if<transport::Tokens>(&*m)) {
        if (out.client_ttft_ms < 0) {
          out.client_ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
        }
        if (!f.json_out) {
          std::fwrite(t->text.data(), 1, t->text.size(), stdout);
          std::fflush(stdout);
        }
      }
      done = out.apply(*m);
    }
    if (!busy) break;
    ++out.busy_retries;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (f.json_out) {
    out.id = 1;
    std::printf("%s\n", dump(out.line()).c_str());
  } else {
    if (out.finished) std::fwrite(out.finished->text.data(), 1, out.finished->text.size(), stdout);
    std::printf("\n");
    std::fflush(stdout);
    if (out.error) {
      std::fprintf(stderr, "troupe submit: %s\n", out.error->c_str());
    } else if (out.finished && !f.quiet) {
      const auto& fin = *out.finished;
      std::fprintf(
          stderr,
          "[%s | %d prompt + %d generated tokens | queue %.1f ms, first token %.1f ms, total %.1f ms]\n",
          core::to_string(fin.finish_reason), fin.usage.prompt_tokens, fin.usage.completion_tokens,
          fin.timings.queue_ms, fin.timings.ttft_ms, fin.timings.e2e_ms);
      if (fin.finish_reason == core::FinishReason::kError)
        std::fprintf(stderr, "error: %s\n", fin.error.c_str());
    }
  }
  return out.ok() ? 0 : 1;
}

int submit_file(const SubmitFlags& f) {
  std::ifstream in(f.input);
  if (!in) throw std::invalid_argument("cannot read --input '" + f.input + "'");
  std::ofstream outf(f.output);
  if (!outf) throw std::invalid_argument("cannot write --output '" + f.output + "'");
  std::vector<Outcome> jobs;
  std::vector<std::optional<transport::Submit>> submits;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Outcome o;
    o.id = static_cast<int64_t>(jobs.size() + 1);
    std::optional<transport::Submit> s;
    try {
      json j = cluster::parse_json_input(line);
      if (j.is_object() && j.contains("id")) o.id = j["id"];
      o.job = parse_job_line(j);
      s = o.job.job;
      s->tag = jobs.size() + 1;
    } catch (const std::exception& e) {
      o.error = e.what();
    }
    jobs.push_back(std::move(o));
    submits.push_back(std::move(s));
  }

  cluster::Client client(client_options(f.client));
  const size_t limit = f.max_in_flight > 0 ? static_cast<size_t>(f.max_in_flight) : jobs.size();
  size_t next = 0, in_flight = 0, done = 0, written = 0;
  int64_t tokens = 0;
  std::map<Clock::time_point, size_t> retry_at;  // busy jobs, sent again later
  const bool tty = isatty(STDERR_FILENO) && !f.quiet;
  const auto start = Clock::now();
  auto last_bar = start;
  auto flush_ready = [&] {
    while (written < jobs.size() && (jobs[written].finished || jobs[written].error)) {
      outf << dump(jobs[written++].line()) << '\n';
    }
    outf.flush();
  };
  for (size_t i = 0; i < jobs.size(); ++i) done += jobs[i].error ? 1 : 0;
  flush_ready();
  const auto silence = timeout_of(f.client);
  auto last_heard = Clock::now();
  while (done < jobs.size()) {
    while (in_flight < limit && next < jobs.size()) {
      if (submits[next]) {
        client.send(*submits[next]);
        ++in_flight;
      }
      ++next;
    }
    const auto now = Clock::now();
    while (!retry_at.empty() && retry_at.begin()->first <= now && in_flight < limit) {
      client.send(*submits[retry_at.begin()->second]);
      ++in_flight;
      retry_at.erase(retry_at.begin());
    }
    auto m = client.next(std::chrono::milliseconds(100));
    if (!m) {
      if (Clock::now() - last_heard > silence && (in_flight > 0 || !retry_at.empty())) {
        // Every job still open gets its error line; the file stays whole.
        const std::string why =
            "no answer from the head at " + f.client.to + " for " + seconds_text(f.client.timeout_s) + " s";
        std::fprintf(stderr, "%stroupe submit: %s; %zu job(s) unfinished\n", tty ? "\n" : "", why.c_str(),
                     jobs.size() - done);
        for (Outcome& o : jobs)
          if (!o.finished && !o.error) o.error = why;
        done = jobs.size();
        break;
      }
    } else {
      last_heard = Clock::now();
      const auto tag = tag_of(*m);
      if (auto* e = connection_error(*m)) {
        const std::string why = std::string(transport::to_string(e->code)) + ": " + e->message;
        std::fprintf(stderr, "%stroupe submit: %s\n", tty ? "\n" : "", why.c_str());
        for (Outcome& o : jobs)
          if (!o.finished && !o.error) o.error = why;
        done = jobs.size();
        break;
      }
      if (tag && *tag >= 1 && *tag <= jobs.size()) {
        Outcome& o = jobs[*tag - 1];
        if (auto* r = std::get_if<transport::Rejected>(&*m);
            r && r->code == transport::RejectCode::kBusy && o.busy_retries < 1000) {
          ++o.busy_retries;
          --in_flight;
          retry_at.emplace(Clock::now() + std::chrono::milliseconds(100 + 10 * o.busy_retries), *tag - 1);
        } else {
          if (auto* t = std::get_if<transport::Tokens>(&*m)) tokens += static_cast<int64_t>(t->ids.size());
          if (o.apply(*m)) {
            --in_flight;
            ++done;
            flush_ready();
          }
        }
      }
    }
    if (tty && Clock::now() - last_bar > std::chrono::milliseconds(200)) {
      last_bar = Clock::now();
      const double secs = std::chrono::duration<double>(last_bar - start).count();
      const int width = 30, fill = static_cast<int>(width * done / std::max<size_t>(1, jobs.size()));
      std::string bar(fill, '#');
      bar.resize(width, '.');
      std::fprintf(stderr, "\r[%s] %zu/%zu jobs | %zu in flight | %lld tokens | %.1f tok/s", bar.c_str(),
                   done, jobs.size(), in_flight, static_cast<long long>(tokens),
                   secs > 0 ? tokens / secs : 0.0);
    }
  }
  flush_ready();
  size_t failed = 0;
  for (const auto& o : jobs) failed += o.ok() ? 0 : 1;
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (!f.quiet) {
    std::fprintf(stderr,
                 "%sjobs: %zu (%zu ok, %zu failed) | output tokens: %lld | %.2f s | %.1f output tok/s\n",
                 tty ? "\n" : "", jobs.size(), jobs.size() - failed, failed, static_cast<long long>(tokens),
                 secs, secs > 0 ? tokens / secs : 0.0);
  }
  return failed == 0 ? 0 : 1;
}

int run_status(const ClientFlags& f, bool json_out) {
  cluster::Client client(client_options(f));
  auto st = client.status(timeout_of(f));
  if (!st && !client.failure().empty()) throw std::runtime_error(client.failure());
  if (!st) throw std::runtime_error("no status from the head at " + f.to + " (is `troupe serve` running?)");
  if (json_out) {
    json workers = json::array();
    for (const auto& w : st->workers) {
      workers.push_back({{"id", w.id},
                         {"node", w.node},
                         {"device", w.device},
                         {"state", w.state},
                         {"kv_used", w.kv_used},
                         {"kv_total", w.kv_total},
                         {"running", w.running},
                         {"waiting", w.waiting},
                         {"tokens_per_s", w.tokens_per_s},
                         {"tokens", w.tokens},
                         {"steps", w.steps},
                         {"busy_s", w.busy_s},
                         {"idle_s", w.idle_s}});
    }
    std::printf("%s\n", dump(json{{"workers", workers},
                                  {"queue_depth", st->queue_depth},
                                  {"max_queue", st->max_queue},
                                  {"requests_served", st->requests_served},
                                  {"requests_running", st->requests_running},
                                  {"requests_rejected", st->requests_rejected},
                                  {"workers_lost", st->workers_lost},
                                  {"workers_hung", st->workers_hung},
                                  {"workers_broken", st->workers_broken},
                                  {"requests_moved", st->requests_moved},
                                  {"tokens_recomputed", st->tokens_recomputed},
                                  {"uptime_s", st->uptime_s}})
                            .c_str());
    return 0;
  }
  std::printf("%-6s %-24s %-8s %-9s %15s %8s %8s %10s\n", "worker", "node", "device", "state",
              "KV used/total", "running", "waiting", "tokens/s");
  for (const auto& w : st->workers) {
    const std::string kv = std::to_string(w.kv_used) + "/" + std::to_string(w.kv_total);
    std::printf("%-6u %-24s %-8s %-9s %15s %8d %8d %10.1f\n", w.id, w.node.c_str(), w.device.c_str(),
                w.state.c_str(), kv.c_str(), w.running, w.waiting, w.tokens_per_s);
  }
  if (st->workers.empty()) std::printf("(no workers: jobs wait for one)\n");
  std::printf(
      "queue: %lld waiting (max %lld) | requests: %llu served, %llu in flight, %llu rejected | up %.0f s\n",
      static_cast<long long>(st->queue_depth), static_cast<long long>(st->max_queue),
      static_cast<unsigned long long>(st->requests_served),
      static_cast<unsigned long long>(st->requests_running),
      static_cast<unsigned long long>(st->requests_rejected), st->uptime_s);
  std::printf("faults: workers %llu lost, %llu hung, %llu broken | %llu requests moved, %llu tokens recomputed\n",
              static_cast<unsigned long long>(st->workers_lost), static_cast<unsigned long long>(st->workers_hung),
              static_cast<unsigned long long>(st->workers_broken),
              static_cast<unsigned long long>(st->requests_moved),
              static_cast<unsigned long long>(st->tokens_recomputed));
  return 0;
}

}  // namespace

void add_submit_commands(CLI::App& app, Registry& registry) {
  {
    auto* sub =
        app.add_subcommand("submit", "Send jobs to a running head: one prompt (streamed) or a JSONL file");
    auto f = std::make_shared<SubmitFlags>();
    add_client_flags(sub, f->client);
    auto* p = sub->add_option("--prompt", f->prompt, "One prompt; its text streams to stdout");
    auto* i = sub->add_option("--input", f->input, "JSONL jobs (the line format of troupe batch)");
    sub->add_option("--output", f->output, "JSONL results, in input order (with --input)");
    p->excludes(i);
    transport::Submit& j = f->job;
    sub->add_option("--max-tokens", j.max_tokens, "Tokens to generate at most")->check(positive_number());
    sub->add_option("--temperature", j.temperature, "0 = greedy")->check(non_negative_number());
    sub->add_option("--top-k", j.top_k, "0 = off")->check(non_negative_number());
    sub->add_option("--top-p", j.top_p, "1 = off")->check(CLI::Range(0.0, 1.0));
    sub->add_option("--seed", j.seed, "Seed of the draws (default: the head picks one)");
    sub->add_option("--stop", j.stop, "Stop string (repeatable)");
    sub->add_option("--logprobs", j.logprobs, "Logprobs of the K most likely tokens (-1 = none)")
        ->check(CLI::Range(-1, 20));
    sub->add_flag("--ignore-eos", j.ignore_eos, "Generate past <|endoftext|>");
    add_logit_flags(sub, j.presence_penalty, j.frequency_penalty, j.repetition_penalty, f->logit_bias);
    sub->add_option("--priority", j.priority, "Lower runs first");
    sub->add_option("--max-in-flight", f->max_in_flight, "Jobs of --input in flight at once (0 = all)")
        ->check(non_negative_number());
    sub->add_flag("--json", f->json_out, "Print the result as one JSON object (no streaming)");
    sub->add_flag("--quiet", f->quiet, "No progress bar or summary");
    registry.push_back({sub, [f] {
                          if (!f->input.empty()) {
                            if (f->output.empty()) throw std::invalid_argument("--input needs --output");
                            return submit_file(*f);
                          }
                          if (f->prompt.empty())
                            throw std::invalid_argument("give --prompt TEXT or --input FILE");
                          f->job.logit_bias = parse_logit_bias(f->logit_bias);
                          return submit_one(*f);
                        }});
  }
  {
    auto* sub = app.add_subcommand("status", "Workers, queue and counters of a running head");
    auto f = std::make_shared<ClientFlags>();
    auto json_out = std::make_shared<bool>(false);
    add_client_flags(sub, *f);
    f->timeout_s = 10;
    sub->add_flag("--json", *json_out, "JSON with a `workers` list");
    registry.push_back({sub, [f, json_out] { return run_status(*f, *json_out); }});
  }
}

}  // namespace troupe::cli
