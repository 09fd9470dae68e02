// troupe simulate: a cluster under load in virtual time (the real scheduler,
// workers replaced by a cost model), reported with troupe bench's metrics.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "cluster/sim/cluster_spec.hpp"
#include "cluster/sim/event_file.hpp"
#include "cluster/sim/parse_number.hpp"
#include "cluster/sim/plots.hpp"
#include "cluster/sim/sim_report.hpp"
#include "cluster/sim/simulator.hpp"
#include "cluster/sim/sweep.hpp"
#include "cluster/sim/trace_reader.hpp"
#include "core/memory_size.hpp"
#include "model/cpu_count.hpp"

namespace troupe::cli {
namespace {

namespace sim = cluster::sim;
using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct SimulateFlags {
  std::string cost, cluster;
  int32_t workers = 1;
  double net_latency_us = 0, net_bandwidth_gbps = 0;
  double request_rate = std::numeric_limits<double>::infinity(), burstiness = 1, range_ratio = 0;
  int32_t num_requests = 1000, max_concurrency = 0, random_input_len = 512, random_output_len = 128;
  std::string input_dist, output_dist;
  std::string trace, trace_format;
  double trace_time_scale = 1;
  double cost_scale = 1;
  int32_t trace_block_tokens = 512;
  int32_t max_num_seqs = 256, max_batched_tokens = 2048, block_size = 16, num_blocks = 0,
          max_steps_in_flight = 2;
  std::string kv_memory = "2GiB", placement = "prefix-affinity", overlong = "clip";
  bool no_prefix_caching = false, no_chunked_prefill = false, no_worker_tables = false;
  uint64_t seed = 0;
  std::string json, csv, plot, sweep, percentiles = "90,99", step_log;
  bool json_itls = false, find_workers = false, progress = false, quiet = false;
  int32_t max_workers = 1024;
  std::vector<std::string> goodput;
  std::vector<std::string> fail_workers, hang_workers, drain_workers;  // ID@SECONDS each
  std::string events;                                                  // an events file (event_file.hpp)
  std::string head_cost;  // troupe profile --head's file: the head as a server with a queue
  int32_t heartbeat_ms = 1000, liveness = 3;                           // the head's: a kill is noticed after both
  double slo_attainment = 0.9, sample_interval_s = 1;
  CLI::App* app = nullptr;
  bool given(const char* flag) const { return app->count(flag) > 0; }
};

// One line on stderr, redrawn in place on a terminal; only when asked or on a TTY.
class ProgressBar {
 public:
  ProgressBar(bool enabled, std::string label)
      : on_(enabled), tty_(isatty(STDERR_FILENO)), label_(std::move(label)) {}
  void operator()(int64_t done, int64_t total) {
    if (!on_) return;
    const auto now = Clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(tty_ ? 200 : 5000)) return;
    last_ = now;
    const int width = 30, fill = total > 0 ? static_cast<int>(width * done / total) : width;
    const double secs = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "%s%s [%s%s] %lld/%lld requests | %.1f s wall%s", tty_ ? "\r" : "", label_.c_str(),
                 std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total), secs,
                 tty_ && done < total ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool on_, tty_;
  std::string label_;
  Clock::time_point start_ = Clock::now(), last_{};
};

std::vector<double> parse_percentiles(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto v = sim::parse_number(item);
    if (!v || *v < 0 || *v > 100)
      throw std::invalid_argument("--percentiles: '" + item + "' is not in [0, 100]");
    out.push_back(*v);
  }
  if (out.empty()) throw std::invalid_argument("--percentiles needs at least one value");
  return out;
}

sim::ClusterSpec cluster_spec(const SimulateFlags& f) {
  sim::ClusterSpec spec;
  if (!f.cluster.empty()) {
    if (f.given("--workers")) throw std::invalid_argument("give --cluster or --workers, not both");
    spec = sim::load_cluster_file(f.cluster, core::parse_memory_size);
    for (auto& g : spec.groups)
      if (g.cost.empty()) g.cost = f.cost;
  } else {
    if (f.cost.empty())
      throw std::invalid_argument("give --cost (a profile from `troupe profile`), or --cluster");
    sim::NodeGroup g;
    g.name = "worker";
    g.count = f.workers;
    g.cost = f.cost;
    g.local = f.net_latency_us == 0 && f.net_bandwidth_gbps == 0;
    g.link.latency_ns = std::llround(f.net_latency_us * 1e3);
    g.link.bandwidth_bytes_per_s = f.net_bandwidth_gbps * 1e9 / 8;
    spec.groups.push_back(g);
  }
  // Flags given on the command line override the file.
  auto& s = spec.scheduler;
  if (f.cluster.empty() || f.given("--max-num-seqs")) s.max_num_seqs = f.max_num_seqs;
  if (f.cluster.empty() || f.given("--max-batched-tokens")) s.max_batched_tokens = f.max_batched_tokens;
  if (f.cluster.empty() || f.given("--block-size")) s.block_size = f.block_size;
  if (f.cluster.empty() || f.given("--max-steps-in-flight")) s.max_steps_in_flight = f.max_steps_in_flight;
  if (f.no_prefix_caching) s.prefix_caching = false;
  if (f.no_chunked_prefill) s.chunked_prefill = false;
  if (f.cluster.empty() || f.given("--placement")) spec.placement = core::parse_placement(f.placement);
  for (auto& g : spec.groups) {
    if (f.given("--num-blocks")) {
      g.kv_blocks = f.num_blocks;
    } else if (f.given("--kv-memory") || (f.cluster.empty() && g.kv_blocks == 0 && g.kv_memory == 0)) {
      g.kv_blocks = 0;
      g.kv_memory = core::parse_memory_size(f.kv_memory);
    }
  }
  return spec;
}

// The workload: synthetic at `rate`, or the trace rescaled to `rate` (when given).
struct Workload {
  std::vector<sim::WorkloadRequest> base;  // as generated / read
  double base_rate = 0;                    // the trace's mean rate (trace only)
  bool trace = false;
  ordered_json description;
};

Workload make_workload(const SimulateFlags& f) {
  Workload w;
  if (!f.trace.empty()) {
    if (f.trace_format.empty())
      throw std::invalid_argument("--trace needs --trace-format azure|burstgpt|mooncake");
    sim::TraceOptions o;
    o.max_requests = f.given("--num-requests") ? f.num_requests : 0;
    o.mooncake_block_tokens = f.trace_block_tokens;
    sim::Trace t = sim::read_trace(f.trace, sim::parse_trace_format(f.trace_format), o);
    if (t.requests.empty()) throw std::runtime_error("trace '" + f.trace + "' has no usable requests");
    w.base = sim::scale_arrivals(std::move(t.requests), f.trace_time_scale);
    w.trace = true;
    const double span = (w.base.back().arrival_ns - w.base.front().arrival_ns) / 1e9;
    w.base_rate = span > 0 ? (w.base.size() - 1) / span : std::numeric_limits<double>::infinity();
    w.description = {{"kind", "trace"},           {"file", f.trace},
                     {"format", f.trace_format},  {"rows", t.rows},
                     {"skipped_rows", t.skipped}, {"time_scale", f.trace_time_scale},
                     {"mean_rate", w.base_rate},  {"block_tokens", f.trace_block_tokens}};
    return w;
  }
  if (f.given("--trace-format")) throw std::invalid_argument("--trace-format needs --trace");
  w.description = {{"kind", "synthetic"}};
  return w;
}

std::vector<sim::WorkloadRequest> workload_at(const SimulateFlags& f, const Workload& w, double rate,
                                              ordered_json* description) {
  if (w.trace) {
    if (std::isinf(rate) || std::isinf(w.base_rate)) return w.base;
    if (description) (*description)["rescaled_to_rate"] = rate;
    return sim::scale_arrivals(w.base, w.base_rate / rate);
  }
  sim::SyntheticOptions o;
  o.num_requests = f.num_requests;
  o.request_rate = rate;
  o.burstiness = f.burstiness;
  o.seed = f.seed;
  auto len = [&](const std::string& spec, int32_t mean) {
    if (!spec.empty()) return sim::parse_length_distribution(spec);
    sim::LengthDistribution d;
    d.kind = f.range_ratio > 0 ? sim::LengthKind::kUniform : sim::LengthKind::kFixed;
    d.mean = mean;
    d.range_ratio = f.range_ratio;
    return d;
  };
  o.input = len(f.input_dist, f.random_input_len);
  o.output = len(f.output_dist, f.random_output_len);
  if (description) {
    (*description)["request_rate"] = std::isinf(rate) ? ordered_json("inf") : ordered_json(rate);
    (*description)["burstiness"] = f.burstiness;
    (*description)["num_requests"] = f.num_requests;
    (*description)["input"] = sim::to_string(o.input);
    (*description)["output"] = sim::to_string(o.output);
  }
  return sim::generate_synthetic(o);
}

struct Setup {
  sim::ClusterSpec spec;
  sim::CostProfiles profiles;
  Workload workload;
  std::vector<sim::EventEntry> events;  // --events, read once
  sim::HeadCost head;                   // --head-cost, read once (free without)
  core::MetricsOptions metrics;
  sim::SloCheck slo;
};

sim::SimOptions sim_options(const SimulateFlags& f, Setup& s, const sim::ClusterSpec& spec) {
  sim::SimOptions o;
  o.workers = sim::build_workers(spec, s.profiles);
  o.batcher.placement = spec.placement;
  o.max_concurrency = f.max_concurrency;
  o.sample_interval_ns = std::llround(f.sample_interval_s * 1e9);
  const sim::ModelShape m = sim::cluster_model(spec, s.profiles);
  o.prompts.vocab_size = m.vocab_size;
  o.prompts.trace_block_tokens = f.trace_block_tokens;
  o.prompts.seed = f.seed;
  o.seed = f.seed;
  o.worker_tables = !f.no_worker_tables;
  // A second CPU runs half the workers' events, or checks the plans when the
  // run cannot be split (the same result either way).
  o.tables_on_thread = o.parallel = model::usable_cpus() >= 2;
  if (f.overlong != "clip" && f.overlong != "fail")
    throw std::invalid_argument("--overlong must be clip or fail, got '" + f.overlong + "'");
  o.overlong = f.overlong == "clip" ? sim::OverlongPolicy::kClip : sim::OverlongPolicy::kFail;
  for (const auto& [kind, list] : {std::pair{sim::FaultKind::kKill, &f.fail_workers},
                                   std::pair{sim::FaultKind::kHang, &f.hang_workers},
                                   std::pair{sim::FaultKind::kDrain, &f.drain_workers}})
    for (const std::string& text : *list) o.faults.push_back(sim::parse_fault(kind, text));
  for (sim::SimFault& e : sim::resolve_events(s.events, spec, s.profiles, f.cost))
    o.faults.push_back(std::move(e));
  o.node_loss_ns = int64_t{f.heartbeat_ms} * f.liveness * 1'000'000;
  o.head = s.head;
  if (!f.step_log.empty()) {
    if (f.given("--sweep") || f.find_workers)
      throw std::invalid_argument("--step-log writes one run's steps: not with --sweep or --find-workers");
    o.step_log = core::StepLog::to_file(f.step_log);
    if (!o.step_log) throw std::invalid_argument("--step-log " + f.step_log + ": cannot write it");
  }
  return o;
}

ordered_json config_json(const SimulateFlags& f, const sim::ClusterSpec& spec, const ordered_json& workload) {
  ordered_json nodes = ordered_json::array();
  for (const auto& g : spec.groups) {
    nodes.push_back({{"name", g.name},
                     {"count", g.count},
                     {"workers", g.workers},
                     {"cost", g.cost},
                     {"cost_scale", g.cost_scale},
                     {"kv_blocks", g.kv_blocks},
                     {"kv_memory", g.kv_memory},
                     {"local", g.local},
                     {"latency_us", g.link.latency_ns / 1e3},
                     {"bandwidth_gbps", g.link.bandwidth_bytes_per_s * 8 / 1e9}});
  }
  const auto& s = spec.scheduler;
  return {{"workers", sim::total_workers(spec)},
          {"nodes", std::move(nodes)},
          {"cost_scale", f.cost_scale},
          {"placement", core::to_string(spec.placement)},
          {"scheduler",
           {{"max_num_seqs", s.max_num_seqs},
            {"max_batched_tokens", s.max_batched_tokens},
            {"block_size", s.block_size},
            {"prefix_caching", s.prefix_caching},
            {"chunked_prefill", s.chunked_prefill},
            {"max_steps_in_flight", s.max_steps_in_flight}}},
          {"workload", workload},
          {"max_concurrency", f.max_concurrency},
          {"overlong", f.overlong},
          {"seed", f.seed},
          {"sample_interval_s", f.sample_interval_s},
          {"network_message_bytes", "estimated from each plan's contents"}};
}
// config_json, and the head's cost when it has one.
ordered_json config_json(const SimulateFlags& f, const Setup& s, const ordered_json& workload) {
  ordered_json j = config_json(f, s.spec, workload);
  if (!s.head.free())
    j["head_cost"] = {{"file", f.head_cost},
                      {"request_ns", s.head.request_ns},
                      {"step_ns", s.head.step_ns},
                      {"token_ns", s.head.token_ns},
                      {"idle_share", s.head.idle_share}};
  return j;
}

struct Run {
  sim::SimResult result;
  core::ServingMetrics metrics;
  ordered_json workload;
};

Run run_once(const SimulateFlags& f, Setup& s, const sim::ClusterSpec& spec, double rate,
             const std::string& label) {
  Run r;
  r.workload = s.workload.description;
  const auto requests = workload_at(f, s.workload, rate, &r.workload);
  sim::SimOptions o = sim_options(f, s, spec);
  ProgressBar bar(!f.quiet && (f.progress || isatty(STDERR_FILENO)), label);
  o.progress = [&bar](int64_t done, int64_t total) { bar(done, total); };
  r.result = sim::simulate(requests, o);
  r.metrics = sim::simulation_metrics(r.result, s.metrics);
  return r;
}

void write_json(const std::string& path, const ordered_json& j) {
  std::ofstream out(path);
  if (!out) throw std::invalid_argument("cannot write --json '" + path + "'");
  out << j.dump(1) << '\n';
  if (!out) throw std::runtime_error("error writing '" + path + "'");
}

ordered_json summary_json(const core::ServingMetrics& m) {
  ordered_json j = core::to_result_json(m, {}, {false});
  for (const char* k : {"input_lens", "output_lens", "ttfts", "latencies", "start_times", "errors", "ids",
                        "first_token_times", "end_times"})
    j.erase(k);
  return j;
}

// --json of a sweep or a search: the setup, one row per run, the answer.
void write_search_json(const SimulateFlags& f, const Setup& s, const char* rows_key, ordered_json rows,
                       const char* answer_key, ordered_json answer) {
  if (f.json.empty()) return;
  ordered_json j;
  j["simulation"] = config_json(f, s, s.workload.description);
  j[rows_key] = std::move(rows);
  j[answer_key] = std::move(answer);
  write_json(f.json, j);
}

int run_sweep(const SimulateFlags& f, Setup& s) {
  const auto rates = sim::parse_rate_sweep(f.sweep);
  const int32_t total = static_cast<int32_t>(workload_at(f, s.workload, rates.front(), nullptr).size());
  const auto points = sim::sweep_rates(
      rates,
      [&](double rate) {
        char label[64];
        std::snprintf(label, sizeof label, "rate %g", rate);
        return run_once(f, s, s.spec, rate, label).metrics;
      },
      total, s.slo);
  std::printf("%10s %12s %12s %12s %12s %12s %10s %6s\n", "rate", "req/s", "tok/s", "med TTFT", "p99 TTFT",
              "med TPOT", "attain", "meets");
  ordered_json rows = ordered_json::array();
  for (const auto& p : points) {
    const auto& m = p.metrics;
    std::printf("%10.3f %12.3f %12.1f %12.2f %12.2f %12.2f %9.1f%% %6s\n", p.rate, m.request_throughput,
                m.output_throughput, m.ttft.median_ms, m.ttft.percentiles_ms.back().second, m.tpot.median_ms,
                100 * p.attainment, p.meets ? "yes" : "no");
    ordered_json row = summary_json(m);
    row["request_rate"] = p.rate;
    row["slo_attainment"] = p.attainment;
    row["meets_slo"] = p.meets;
    rows.push_back(std::move(row));
  }
  const double best = sim::highest_rate_meeting(points);
  if (best > 0) {
    std::printf("highest rate meeting the SLOs (%s, %.0f%% of requests): %g req/s\n",
                s.slo.slo.empty() ? "all requests complete" : core::to_string(s.slo.slo).c_str(),
                100 * s.slo.attainment, best);
  } else {
    std::printf("no rate of the sweep meets the SLOs\n");
  }
  write_search_json(f, s, "sweep", std::move(rows), "highest_rate_meeting_slo",
                    best > 0 ? ordered_json(best) : ordered_json(nullptr));
  if (!f.plot.empty())
    for (const auto& img : sim::plot_sweep(f.plot, points)) std::printf("wrote %s\n", img.c_str());
  return 0;
}

int run_find_workers(const SimulateFlags& f, Setup& s) {
  if (std::isinf(f.request_rate) && s.workload.base_rate == 0 && f.max_concurrency == 0)
    throw std::invalid_argument("--find-workers needs a finite --request-rate (or a trace)");
  const int32_t total = static_cast<int32_t>(workload_at(f, s.workload, f.request_rate, nullptr).size());
  const int32_t fixed =
      sim::total_workers(s.spec) - s.spec.groups.back().count * s.spec.groups.back().workers;
  std::vector<std::pair<int32_t, bool>> seen;
  ordered_json rows = ordered_json::array();
  std::printf("%8s %12s %12s %12s %10s %6s\n", "workers", "req/s", "med TTFT", "med TPOT", "attain", "meets");
  const int32_t per_node = s.spec.groups.back().workers;
  const int32_t max_nodes = std::max(1, (f.max_workers - fixed) / per_node);
  const int32_t nodes = sim::smallest_passing(
      max_nodes,
      [&](int32_t n) {
        const sim::ClusterSpec spec = sim::with_last_group_nodes(s.spec, n);
        const Run r =
            run_once(f, s, spec, f.request_rate, std::to_string(sim::total_workers(spec)) + " workers");
        const double a = sim::attainment(r.metrics, total, s.slo);
        const bool ok = sim::meets(r.metrics, total, s.slo);
        std::printf("%8d %12.3f %12.2f %12.2f %9.1f%% %6s\n", sim::total_workers(spec),
                    r.metrics.request_throughput, r.metrics.ttft.median_ms, r.metrics.tpot.median_ms, 100 * a,
                    ok ? "yes" : "no");
        ordered_json row = summary_json(r.metrics);
        row["workers"] = sim::total_workers(spec);
        row["slo_attainment"] = a;
        row["meets_slo"] = ok;
        rows.push_back(std::move(row));
        return ok;
      },
      &seen);
  const int32_t fewest = nodes < 0 ? -1 : fixed + nodes * per_node;
  if (fewest > 0) {
    std::printf("fewest workers meeting the SLOs at %g req/s: %d\n", f.request_rate, fewest);
  } else {
    std::printf("even %d workers do not meet the SLOs at %g req/s (raise --max-workers?)\n", f.max_workers,
                f.request_rate);
  }
  write_search_json(f, s, "find_workers", std::move(rows), "fewest_workers",
                    fewest > 0 ? ordered_json(fewest) : ordered_json(nullptr));
  return 0;
}

int run_simulate(const SimulateFlags& f) {
  Setup s;
  if (!std::isfinite(f.cost_scale) || !(f.cost_scale > 0))
    throw std::invalid_argument("--cost-scale must be a finite number > 0, got " +
                                f.app->get_option("--cost-scale")->as<std::string>());
  s.profiles = sim::CostProfiles(f.cost_scale);
  s.spec = cluster_spec(f);
  s.workload = make_workload(f);
  if (!f.events.empty()) s.events = sim::load_events_file(f.events, core::parse_memory_size);
  if (!f.head_cost.empty()) s.head = sim::read_head_profile(f.head_cost).cost;
  s.metrics.percentiles = parse_percentiles(f.percentiles);
  s.metrics.slo = core::parse_slo(f.goodput);
  s.slo.slo = s.metrics.slo;
  s.slo.attainment = f.slo_attainment;
  if (!(f.slo_attainment > 0 && f.slo_attainment <= 1))
    throw std::invalid_argument("--slo-attainment must lie in (0, 1]");
  if (!(f.sample_interval_s >= 0)) throw std::invalid_argument("--sample-interval must be >= 0 seconds");
  if (!f.sweep.empty() && f.find_workers)
    throw std::invalid_argument("give --sweep or --find-workers, not both");
  if (!f.sweep.empty()) return run_sweep(f, s);
  if (f.find_workers) return run_find_workers(f, s);

  const double rate = s.workload.trace && !f.given("--request-rate") ? std::numeric_limits<double>::infinity()
                                                                     : f.request_rate;
  const Run r = run_once(f, s, s.spec, rate, "simulating");
  std::printf("%s", core::format_summary(r.metrics, "Simulation Result").c_str());
  std::printf("%s", sim::format_cluster_summary(r.result).c_str());
  std::printf("%s", sim::format_fault_summary(r.result).c_str());
  if (!f.json.empty()) {
    sim::ReportOptions ro;
    ro.metrics = s.metrics;
    ro.itls = f.json_itls;
    ro.config = config_json(f, s, r.workload);
    ordered_json j;
    j["backend"] = "troupe-simulate";
    j["num_prompts"] = r.result.requests.size();
    j["request_rate"] = std::isinf(rate) ? ordered_json("inf") : ordered_json(rate);
    j["burstiness"] = f.burstiness;
    j["max_concurrency"] = f.max_concurrency > 0 ? ordered_json(f.max_concurrency) : ordered_json(nullptr);
    ordered_json report = sim::simulation_json(r.result, r.metrics, ro);
    for (auto& [k, v] : report.items()) j[k] = std::move(v);
    write_json(f.json, j);
  }
  if (!f.csv.empty()) sim::write_csv_reports(f.csv, r.result);
  if (!f.plot.empty())
    for (const auto& img : sim::plot_simulation(f.plot, r.result)) std::printf("wrote %s\n", img.c_str());
  return 0;
}

}  // namespace

void add_simulate_command(CLI::App& app, Registry& registry) {
  auto* sub = app.add_subcommand("simulate",
                                 "Simulate a cluster under load: the real scheduler, workers replaced "
                                 "by a cost model from `troupe profile`");
  auto f = std::make_shared<SimulateFlags>();
  f->app = sub;
  sub->add_option("--cost", f->cost,
                  "Cost profile (troupe profile --out); with --cluster, for nodes naming none");
  sub->add_option("--cluster", f->cluster,
                  "Cluster file (YAML): nodes, workers, costs, KV, network, scheduler");
  sub->add_option("--cost-scale", f->cost_scale,
                  "Multiply every predicted step time (a device this much slower; < 1: faster)");
  sub->add_option("--workers", f->workers, "Workers, each with --cost (without --cluster)")
      ->check(positive_number());
  sub->add_option("--net-latency-us", f->net_latency_us,
                  "With --workers: one-way latency to each worker (0 = local)")
      ->check(non_negative_number());
  sub->add_option("--net-bandwidth-gbps", f->net_bandwidth_gbps,
                  "With --workers: link bandwidth (0 = unlimited)")
      ->check(non_negative_number());
  sub->add_option(
      "--request-rate", f->request_rate,
      "Requests per second (default inf: all at once); with --trace, rescales it to this mean rate");
  sub->add_option("--num-requests", f->num_requests, "Requests to send (with --trace: the first N rows)")
      ->check(positive_number());
  sub->add_option("--burstiness", f->burstiness, "Gamma shape of the gaps between requests (1 = Poisson)");
  sub->add_option("--max-concurrency", f->max_concurrency, "Requests outstanding at most (0 = no limit)")
      ->check(non_negative_number());
  sub->add_option("--random-input-len", f->random_input_len, "Prompt tokens")->check(positive_number());
  sub->add_option("--random-output-len", f->random_output_len, "Output tokens (ignore_eos)")
      ->check(positive_number());
  sub->add_option("--range-ratio", f->range_ratio, "Lengths uniform in [L(1-X), L(1+X)]")
      ->check(CLI::Range(0.0, 0.999));
  sub->add_option("--input-len-dist", f->input_dist,
                  "Instead: fixed:L, uniform:L:X, lognormal:MEAN:SIGMA, file:PATH");
  sub->add_option("--output-len-dist", f->output_dist,
                  "Instead: fixed:L, uniform:L:X, lognormal:MEAN:SIGMA, file:PATH");
  sub->add_option("--trace", f->trace, "Replay a trace instead of synthetic requests");
  sub->add_option("--trace-format", f->trace_format, "azure, burstgpt or mooncake");
  sub->add_option("--trace-time-scale", f->trace_time_scale,
                  "Multiply the trace's arrival times (0.5 = twice as fast)")
      ->check(positive_number());
  sub->add_option("--trace-block-tokens", f->trace_block_tokens, "Prompt tokens per Mooncake hash id")
      ->check(positive_number());
  sub->add_option("--max-num-seqs", f->max_num_seqs, "Running sequences per worker")
      ->check(positive_number());
  sub->add_option("--max-batched-tokens", f->max_batched_tokens, "Tokens per step")->check(positive_number());
  sub->add_option("--block-size", f->block_size, "KV block size (must match the cost profile)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--kv-memory", f->kv_memory, "KV memory per worker, e.g. 2GiB");
  sub->add_option("--num-blocks", f->num_blocks, "KV blocks per worker (overrides --kv-memory)")
      ->check(positive_number());
  sub->add_option("--max-steps-in-flight", f->max_steps_in_flight, "Steps outstanding per worker")
      ->check(CLI::Range(1, 8));
  sub->add_flag("--no-prefix-caching", f->no_prefix_caching, "Do not share KV blocks between equal prefixes");
  sub->add_flag("--no-chunked-prefill", f->no_chunked_prefill, "Run each prompt whole in one step");
  sub->add_flag("--no-worker-tables", f->no_worker_tables,
                "Run plans without each worker's plan check (SequenceTable): same result, faster");
  sub->add_option("--placement", f->placement, "round-robin, least-loaded or prefix-affinity");
  sub->add_option("--fail-worker", f->fail_workers,
                  "Kill worker ID at T seconds of virtual time (ID@T, repeatable): the head removes it, its "
                  "requests move and are recomputed");
  sub->add_option("--hang-worker", f->hang_workers,
                  "Hang worker ID at T seconds (ID@T, repeatable): its steps never finish until the step "
                  "deadline lets it go");
  sub->add_option("--drain-worker", f->drain_workers,
                  "Drain worker ID at T seconds (ID@T, repeatable): no new requests; those it has not started move");
  sub->add_option("--events", f->events,
                  "Events file (YAML): kill, hang, drain, cut a link for a while, add a worker, each at a "
                  "time (with the flags above)");
  sub->add_option("--head-cost", f->head_cost,
                  "The head's cost per event (troupe profile --head's file): the head becomes one server with "
                  "a queue, and the report its utilisation");
  sub->add_option("--heartbeat-ms", f->heartbeat_ms,
                  "The head's heartbeat interval (serve's): a killed worker is noticed after --liveness of them")
      ->check(CLI::Range(1, 3'600'000));
  sub->add_option("--liveness", f->liveness, "Missed heartbeats before the head loses a node (serve's)")
      ->check(CLI::Range(3, 5));
  sub->add_option("--overlong", f->overlong, "Requests longer than the model's context: clip or fail");
  sub->add_option("--seed", f->seed, "Seed of the workload, prompts and schedulers");
  sub->add_option("--json", f->json, "Write the result (vLLM's benchmark keys + the cluster's side)");
  sub->add_option("--step-log", f->step_log,
                  "Write every simulated step, one JSON line each (troupe serve --step-log's format, the "
                  "predicted time as ms)");
  sub->add_flag("--json-itls", f->json_itls, "Include every request's inter-token gaps in --json");
  sub->add_option("--csv", f->csv, "Write series.csv, workers.csv, requests.csv into this folder");
  sub->add_option("--plot", f->plot, "Draw PNG and SVG plots (gnuplot) into this folder");
  sub->add_option("--sweep", f->sweep,
                  "rate=A:B:STEP: latency against load, and the highest rate within the SLOs");
  sub->add_flag("--find-workers", f->find_workers, "The fewest workers meeting the SLOs at --request-rate");
  sub->add_option("--max-workers", f->max_workers, "Largest cluster --find-workers tries")
      ->check(positive_number());
  sub->add_option("--goodput", f->goodput, "SLOs: ttft:MS tpot:MS e2el:MS")->expected(1, 3);
  sub->add_option("--slo-attainment", f->slo_attainment,
                  "Fraction of requests that must meet the SLOs (0.9)");
  sub->add_option("--percentiles", f->percentiles, "Percentiles to report, e.g. 90,99");
  sub->add_option("--sample-interval", f->sample_interval_s,
                  "Time series step, seconds of simulated time (0 = none)");
  sub->add_flag("--progress", f->progress, "Progress on stderr even when it is not a terminal");
  sub->add_flag("--quiet", f->quiet, "No progress");
  registry.push_back({sub, [f] { return run_simulate(*f); }});
}

}  // namespace troupe::cli
