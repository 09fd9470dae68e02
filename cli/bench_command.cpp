// troupe bench: a load test of a troupe head (ZeroMQ) or of any OpenAI-compatible
// server (HTTP), measured at the client as vLLM's serving benchmark measures.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cluster/loadgen/bench_plot.hpp"
#include "cluster/loadgen/load_generator.hpp"
#include "core/serving_metrics.hpp"

namespace troupe::cli {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

struct BenchFlags {
  cluster::LoadOptions load;
  int32_t num_requests = 100;
  std::string rates = "inf";  // one rate, or a comma list (a sweep)
  double burstiness = 1.0;
  int32_t input_len = 1024, output_len = 128, vocab_size = 50257;
  double range_ratio = 0;
  std::string dataset;
  std::vector<std::string> goodput;
  std::string percentiles = "90,99";
  uint64_t seed = 0;
  int timeout_s = 600;
  std::string json_out, plot_dir;
  bool quiet = false;
};

double parse_rate(const std::string& s) {
  if (s == "inf") return std::numeric_limits<double>::infinity();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v > 0)) {
    throw std::invalid_argument("--request-rate: '" + s + "' is not a positive number or inf");
  }
  return v;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// --dataset: JSON lines {"prompt": text | "prompt_ids": [ids], "max_tokens" | "output_len": N}.
std::vector<cluster::LoadRequest> read_dataset(const std::string& path, int32_t limit) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read --dataset '" + path + "'");
  std::vector<cluster::LoadRequest> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line) && static_cast<int32_t>(out.size()) < limit; ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n) + ": ";
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw std::invalid_argument(where + "not a JSON object");
    cluster::LoadRequest r;
    if (j.contains("prompt") && j["prompt"].is_string()) {
      r.prompt = j["prompt"].get<std::string>();
    } else if (j.contains("prompt_ids") && j["prompt_ids"].is_array() && !j["prompt_ids"].empty()) {
      for (const auto& id : j["prompt_ids"]) {
        if (!id.is_number_integer()) throw std::invalid_argument(where + "prompt_ids must be integers");
        r.prompt_ids.push_back(id.get<int32_t>());
      }
      r.prompt_tokens = static_cast<int32_t>(r.prompt_ids.size());
    } else {
      throw std::invalid_argument(where + "needs \"prompt\" (text) or \"prompt_ids\" (token ids)");
    }
    const char* key = j.contains("max_tokens") ? "max_tokens" : "output_len";
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 1 ||
        j[key].get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument(where + "needs \"max_tokens\" (or \"output_len\"), an integer >= 1");
    }
    r.max_tokens = j[key].get<int32_t>();
    out.push_back(std::move(r));
  }
  if (out.empty()) throw std::invalid_argument("--dataset '" + path + "' holds no requests");
  return out;
}

std::string now_stamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

// OUT for one rate; OUT with ".rate-R" before its extension for each rate of a sweep.
std::string path_for_rate(const std::string& out, const std::string& rate, bool sweep) {
  if (!sweep) return out;
  const size_t dot = out.rfind('.');
  const size_t slash = out.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return out + ".rate-" + rate;
  return out.substr(0, dot) + ".rate-" + rate + out.substr(dot);
}

int run_bench(BenchFlags f) {
  f.load.timeout = std::chrono::seconds(f.timeout_s);
  core::MetricsOptions mo;
  mo.slo = core::parse_slo(f.goodput);
  mo.percentiles.clear();
  for (const std::string& p : split_commas(f.percentiles)) {
    try {
      mo.percentiles.push_back(std::stod(p));
    } catch (const std::exception&) {
      throw std::invalid_argument("--metric-percentiles: '" + p + "' is not a number");
    }
  }
  const std::vector<std::string> rates = split_commas(f.rates);
  if (rates.empty()) throw std::invalid_argument("--request-rate is empty");
  for (const auto& r : rates) parse_rate(r);
  const bool sweep = rates.size() > 1;
  const bool tty = isatty(STDERR_FILENO) && !f.quiet;
  if (!f.quiet) {
    f.load.on_progress = [tty](const cluster::LoadProgress& p) {
      const int width = 30, fill = static_cast<int>(width * p.done / std::max<size_t>(1, p.total));
      std::string bar(fill, '#');
      bar.resize(width, '.');
      std::fprintf(stderr, "%s[%s] %zu/%zu requests | %zu in flight | %lld tokens | %.1f s%s",
                   tty ? "\r" : "", bar.c_str(), p.done, p.total, p.in_flight,
                   static_cast<long long>(p.output_tokens), p.elapsed_s, tty ? "" : "\n");
    };
    if (!tty) {  // a log, not a terminal: one line per second at most
      auto inner = f.load.on_progress;
      auto last = std::make_shared<std::chrono::steady_clock::time_point>();
      f.load.on_progress = [inner, last](const cluster::LoadProgress& p) {
        const auto t = std::chrono::steady_clock::now();
        if (p.done < p.total && t - *last < std::chrono::seconds(5)) return;
        *last = t;
        inner(p);
      };
    }
  }
  const std::string target = f.load.to.empty() ? f.load.base_url : f.load.to;
  std::vector<cluster::SweepPoint> points;
  for (const std::string& rate_text : rates) {
    const double rate = parse_rate(rate_text);
    std::vector<cluster::LoadRequest> requests;
    if (!f.dataset.empty()) {
      requests = read_dataset(f.dataset, f.num_requests);
      const auto at =
          cluster::load_arrivals(static_cast<int32_t>(requests.size()), rate, f.burstiness, f.seed);
      for (size_t i = 0; i < requests.size(); ++i) requests[i].arrival_ns = at[i];
    } else {
      cluster::RandomLoadOptions ro;
      ro.num_requests = f.num_requests;
      ro.request_rate = rate;
      ro.burstiness = f.burstiness;
      ro.input_len = f.input_len;
      ro.output_len = f.output_len;
      ro.range_ratio = f.range_ratio;
      ro.vocab_size = f.vocab_size;
      ro.seed = f.seed;
      requests = cluster::random_load(ro);
    }
    if (!f.quiet) {
      std::fprintf(stderr, "troupe bench: %zu requests to %s, rate %s/s, burstiness %g, max concurrency %s\n",
                   requests.size(), target.c_str(), rate_text.c_str(), f.burstiness,
                   f.load.max_concurrency > 0 ? std::to_string(f.load.max_concurrency).c_str() : "none");
    }
    const cluster::LoadResult result = cluster::run_load(requests, f.load);
    if (tty) std::fprintf(stderr, "\n");
    const core::ServingMetrics m = core::compute_serving_metrics(result.requests, result.duration_s, mo);
    std::printf("%s", core::format_summary(m, sweep ? "Serving Benchmark Result (rate " + rate_text + "/s)"
                                                    : "Serving Benchmark Result")
                          .c_str());
    size_t shown = 0;
    for (const auto& r : result.requests) {
      if (!r.success && shown++ < 5)
        std::fprintf(stderr, "request %llu failed: %s\n", (unsigned long long)r.id, r.error.c_str());
    }
    if (!f.json_out.empty()) {
      ordered_json j;
      j["date"] = now_stamp();
      j["backend"] = f.load.to.empty() ? "openai" : "troupe";
      j["endpoint"] = target;
      j["model_id"] = f.load.model;
      j["num_prompts"] = requests.size();
      j["request_rate"] = std::isinf(rate) ? ordered_json("inf") : ordered_json(rate);
      j["burstiness"] = f.burstiness;
      j["max_concurrency"] =
          f.load.max_concurrency > 0 ? ordered_json(f.load.max_concurrency) : ordered_json(nullptr);
      j["seed"] = f.seed;
      j.update(core::to_result_json(m, result.requests));
      const std::string path = path_for_rate(f.json_out, rate_text, sweep);
      std::ofstream out(path);
      out << j.dump(2, ' ', false, ordered_json::error_handler_t::replace) << '\n';
      if (!out) throw std::runtime_error("cannot write --json '" + path + "'");
    }
    if (!f.plot_dir.empty()) {
      const std::string dir = sweep ? f.plot_dir + "/rate-" + rate_text : f.plot_dir;
      cluster::plot_run(dir, result.requests, target + ", rate " + rate_text + "/s");
    }
    points.push_back({rate_text, m});
  }
  if (sweep && !f.plot_dir.empty()) cluster::plot_sweep(f.plot_dir, points, "request-rate sweep: " + target);
  for (const auto& p : points) {
    if (p.metrics.failed > 0) return 1;
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, Registry& registry) {
  auto* sub = app.add_subcommand(
      "bench", "Load-test a troupe head (--to) or any OpenAI-compatible server (--base-url), vLLM's metrics");
  auto f = std::make_shared<BenchFlags>();
  auto* to = sub->add_option("--to", f->load.to, "A troupe head's client endpoint, tcp://HOST:5555");
  auto* url = sub->add_option("--base-url", f->load.base_url,
                              "An OpenAI-compatible server, http://HOST:PORT (streaming /v1/completions)");
  to->excludes(url);
  sub->add_option("--model", f->load.model, "HTTP: the model name to send (default: the server's first)");
  sub->add_option("--api-key", f->load.api_key, "HTTP: bearer token");
  sub->add_option("--num-requests", f->num_requests, "Requests to send")->check(CLI::Range(1, 10000000));
  sub->add_option("--request-rate", f->rates,
                  "Requests per second (gamma arrivals), inf = all at once; a comma list runs a sweep");
  sub->add_option("--burstiness", f->burstiness, "Gamma shape of the gaps: 1 = Poisson, < 1 burstier")
      ->check(positive_number());
  sub->add_option("--max-concurrency", f->load.max_concurrency, "Requests in flight at most (0 = no limit)")
      ->check(non_negative_number());
  auto* in = sub->add_option("--random-input-len", f->input_len, "Random dataset: prompt tokens")
                 ->check(positive_number());
  sub->add_option("--random-output-len", f->output_len, "Random dataset: output tokens")
      ->check(positive_number());
  sub->add_option("--range-ratio", f->range_ratio, "Random dataset: lengths uniform in [L(1-X), L(1+X)]")
      ->check(CLI::Range(0.0, 0.999999));
  sub->add_option("--vocab-size", f->vocab_size, "Random dataset: prompt ids drawn from [0, N)")
      ->check(positive_number());
  auto* ds = sub->add_option("--dataset", f->dataset,
                             "JSON lines: {\"prompt\": text | \"prompt_ids\": [ids], \"max_tokens\": N}");
  ds->excludes(in);
  sub->add_option("--goodput", f->goodput, "SLOs for goodput, e.g. ttft:500 tpot:50 e2el:5000 (ms)");
  sub->add_option("--metric-percentiles", f->percentiles, "Percentiles to report, e.g. 50,90,99");
  sub->add_option("--seed", f->seed, "Seed of arrivals, lengths and prompts (same seed, same requests)");
  sub->add_option("--timeout", f->timeout_s, "Seconds of silence after which a request fails")
      ->check(positive_number());
  sub->add_option("--json", f->json_out, "Write vLLM's result JSON (and every request's timings) here");
  sub->add_option("--plot", f->plot_dir, "Draw latency CDFs and throughput over time (PNG + SVG) here");
  sub->add_flag("--quiet", f->quiet, "No progress bar");
  registry.push_back({sub, [f] {
                        if (f->load.to.empty() && f->load.base_url.empty()) {
                          throw std::invalid_argument(
                              "give --to tcp://HOST:PORT or --base-url http://HOST:PORT");
                        }
                        return run_bench(*f);
                      }});
}

}  // namespace troupe::cli
