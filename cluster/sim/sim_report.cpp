#include "cluster/sim/sim_report.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace troupe::cluster::sim {
namespace {

using nlohmann::ordered_json;

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }
double s(int64_t ns) { return static_cast<double>(ns) / 1e9; }

double utilization(const WorkerReport& w, const SimResult& r) {
  return r.end_ns > 0 ? static_cast<double>(w.busy_ns) / static_cast<double>(r.end_ns) : 0.0;
}
double head_utilization(const SimResult& r) {
  return r.end_ns > 0 ? static_cast<double>(r.head_busy_ns) / static_cast<double>(r.end_ns) : 0.0;
}

std::ofstream open_csv(const std::filesystem::path& p) {
  std::ofstream out(p);
  if (!out) throw std::runtime_error("cannot write '" + p.string() + "'");
  out.precision(10);
  return out;
}

// A CSV field: quoted when it holds a comma, quote or line break.
std::string csv(const std::string& v) {
  if (v.find_first_of(",\"\n\r") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

core::ServingMetrics simulation_metrics(const SimResult& r, const core::MetricsOptions& o) {
  return core::compute_serving_metrics(r.requests, duration_s(r), o);
}

ordered_json simulation_json(const SimResult& r, const core::ServingMetrics& m, const ReportOptions& o) {
  ordered_json j;
  j["simulation"] = o.config;
  ordered_json res = core::to_result_json(m, r.requests, {o.itls});
  for (auto& [k, v] : res.items()) j[k] = v;
  if (!o.metrics.slo.empty()) j["goodput_slo"] = core::to_string(o.metrics.slo);

  std::vector<double> queue_s;
  ordered_json queue = ordered_json::array(), cached = ordered_json::array(), worker = ordered_json::array();
  int64_t hit = 0, query = 0;
  for (size_t i = 0; i < r.requests.size(); ++i) {
    const int64_t sched = r.scheduled_ns[i];
    queue.push_back(sched >= 0 ? ordered_json(s(sched - r.requests[i].start_ns)) : ordered_json(nullptr));
    if (sched >= 0) queue_s.push_back(s(sched - r.requests[i].start_ns));
    cached.push_back(r.cached_tokens[i]);
    worker.push_back(r.worker[i]);
  }
  const core::LatencyStats q = core::summarize_ms(queue_s, o.metrics.percentiles);
  j["mean_queue_ms"] = q.mean_ms;
  j["median_queue_ms"] = q.median_ms;
  for (const auto& [p, v] : q.percentiles_ms) j["p" + core::percentile_word(p) + "_queue_ms"] = v;
  j["queue_times"] = std::move(queue);
  j["cached_tokens"] = std::move(cached);
  j["worker_ids"] = std::move(worker);

  ordered_json workers = ordered_json::array();
  for (const WorkerReport& w : r.workers) {
    hit += w.prefix_hit_tokens;
    query += w.prefix_query_tokens;
    workers.push_back({{"id", w.id},
                       {"node", w.node},
                       {"device", w.device},
                       {"num_blocks", w.num_blocks},
                       {"utilization", utilization(w, r)},
                       {"busy_s", s(w.busy_ns)},
                       {"steps", w.steps},
                       {"tokens_run", w.tokens_run},
                       {"tokens_generated", w.tokens_generated},
                       {"preemptions", w.preemptions},
                       {"prefix_hit_rate",
                        w.prefix_query_tokens ? double(w.prefix_hit_tokens) / w.prefix_query_tokens : 0.0},
                       {"mean_kv_use", w.mean_kv_use},
                       {"peak_kv_use", w.num_blocks ? double(w.peak_blocks_used) / w.num_blocks : 0.0},
                       {"refused_items", w.refused_items}});
  }
  j["prefix_cache_hit_rate"] = query ? static_cast<double>(hit) / static_cast<double>(query) : 0.0;
  j["clipped_requests"] = r.clipped;
  j["events"] = r.events;
  if (r.head_busy_ns > 0)
    j["head"] = {{"utilization", head_utilization(r)}, {"busy_s", s(r.head_busy_ns)},
                 {"max_wait_ms", ms(r.head_max_wait_ns)}};
  j["workers"] = std::move(workers);
  if (!r.faults.empty()) {
    const ordered_json faults = fault_json(r);  // kept alive: items() is a view
    for (const auto& [k, v] : faults.items()) j[k] = v;
  }

  ordered_json series;
  series["interval_s"] = s(r.sample_interval_ns);
  ordered_json t = ordered_json::array(), waiting = ordered_json::array(), running = ordered_json::array(),
               client = ordered_json::array(), tok = ordered_json::array(), fin = ordered_json::array(),
               head = ordered_json::array();
  std::vector<ordered_json> busy(r.workers.size(), ordered_json::array()),
      kv(r.workers.size(), ordered_json::array()), wr(r.workers.size(), ordered_json::array()),
      ww(r.workers.size(), ordered_json::array()), pre(r.workers.size(), ordered_json::array());
  int64_t prev = 0;
  for (const SeriesPoint& p : r.series) {
    const double span = std::max(1e-9, s(p.t_ns - prev));
    prev = p.t_ns;
    t.push_back(s(p.t_ns));
    waiting.push_back(p.waiting);
    running.push_back(p.running);
    client.push_back(p.client_queue);
    head.push_back(p.head_busy);
    tok.push_back(static_cast<double>(p.output_tokens) / span);
    fin.push_back(p.finished / span);
    for (size_t k = 0; k < p.workers.size(); ++k) {
      busy[k].push_back(p.workers[k].busy);
      kv[k].push_back(static_cast<double>(p.workers[k].blocks_used) / r.workers[k].num_blocks);
      wr[k].push_back(p.workers[k].running);
      ww[k].push_back(p.workers[k].waiting);
      pre[k].push_back(p.workers[k].preemptions);
    }
  }
  series["t_s"] = std::move(t);
  series["waiting"] = std::move(waiting);
  series["running"] = std::move(running);
  series["client_queue"] = std::move(client);
  series["output_tokens_per_s"] = std::move(tok);
  series["finished_per_s"] = std::move(fin);
  if (r.head_busy_ns > 0) series["head_busy"] = std::move(head);
  ordered_json sw = ordered_json::array();
  for (size_t k = 0; k < r.workers.size(); ++k) {
    sw.push_back({{"id", r.workers[k].id},
                  {"busy", std::move(busy[k])},
                  {"kv_use", std::move(kv[k])},
                  {"running", std::move(wr[k])},
                  {"waiting", std::move(ww[k])},
                  {"preemptions", std::move(pre[k])}});
  }
  series["workers"] = std::move(sw);
  j["series"] = std::move(series);
  return j;
}

void write_csv_reports(const std::string& dir, const SimResult& r) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create '" + dir + "': " + ec.message());
  const std::filesystem::path d(dir);
  {
    auto out = open_csv(d / "series.csv");
    const bool head = r.head_busy_ns > 0;
    out << "t_s,waiting,running,client_queue,output_tokens_per_s,finished_per_s" << (head ? ",head_busy" : "");
    for (const auto& w : r.workers)
      for (const char* c : {"busy", "kv_use", "running", "waiting", "preemptions"})
        out << ",w" << w.id << "_" << c;
    out << '\n';
    int64_t prev = 0;
    for (const SeriesPoint& p : r.series) {
      const double span = std::max(1e-9, s(p.t_ns - prev));
      prev = p.t_ns;
      out << s(p.t_ns) << ',' << p.waiting << ',' << p.running << ',' << p.client_queue << ','
          << p.output_tokens / span << ',' << p.finished / span;
      if (head) out << ',' << p.head_busy;
      for (size_t k = 0; k < p.workers.size(); ++k) {
        const auto& x = p.workers[k];
        out << ',' << x.busy << ',' << static_cast<double>(x.blocks_used) / r.workers[k].num_blocks << ','
            << x.running << ',' << x.waiting << ',' << x.preemptions;
      }
      out << '\n';
    }
  }
  {
    auto out = open_csv(d / "workers.csv");
    out << "id,node,device,num_blocks,utilization,busy_s,steps,tokens_run,tokens_generated,preemptions,"
           "prefix_hit_rate,mean_kv_use,peak_kv_use\n";
    for (const WorkerReport& w : r.workers) {
      out << w.id << ',' << csv(w.node) << ',' << csv(w.device) << ',' << w.num_blocks << ','
          << utilization(w, r) << ',' << s(w.busy_ns) << ',' << w.steps << ',' << w.tokens_run << ','
          << w.tokens_generated << ',' << w.preemptions << ','
          << (w.prefix_query_tokens ? double(w.prefix_hit_tokens) / w.prefix_query_tokens : 0.0) << ','
          << w.mean_kv_use << ',' << (w.num_blocks ? double(w.peak_blocks_used) / w.num_blocks : 0.0) << '\n';
    }
  }
  {
    auto out = open_csv(d / "requests.csv");
    out << "id,start_s,first_token_s,end_s,ttft_ms,tpot_ms,e2el_ms,queue_ms,input_tokens,output_tokens,"
           "cached_tokens,worker,error\n";
    for (size_t i = 0; i < r.requests.size(); ++i) {
      const auto& t = r.requests[i];
      const bool first = !t.token_ns.empty();
      out << t.id << ',' << s(t.start_ns) << ',';
      if (first) out << s(t.token_ns.front());
      out << ',' << s(t.end_ns) << ',';
      if (first) out << ms(t.token_ns.front() - t.start_ns);
      out << ',';
      if (first && t.output_tokens > 1) out << ms(t.end_ns - t.token_ns.front()) / (t.output_tokens - 1);
      out << ',' << ms(t.end_ns - t.start_ns) << ',';
      if (r.scheduled_ns[i] >= 0) out << ms(r.scheduled_ns[i] - t.start_ns);
      out << ',' << t.prompt_tokens << ',' << t.output_tokens << ',' << r.cached_tokens[i] << ','
          << r.worker[i] << ',' << csv(t.error) << '\n';
    }
    if (!out) throw std::runtime_error("error writing '" + (d / "requests.csv").string() + "'");
  }
}

namespace {

// The latencies of the requests a fault moved (affected) or of the others.
ordered_json group_json(const SimResult& r, bool affected) {
  std::vector<core::RequestTiming> group;
  for (size_t i = 0; i < r.requests.size(); ++i)
    if ((r.affected[i] != 0) == affected) group.push_back(r.requests[i]);
  ordered_json g;
  g["requests"] = group.size();
  if (group.empty()) return g;
  const core::ServingMetrics m = core::compute_serving_metrics(group, duration_s(r), {{50, 99}, {}});
  g["completed"] = m.completed;
  g["median_ttft_ms"] = m.ttft.median_ms;
  g["p99_ttft_ms"] = m.ttft.at(99);
  g["median_tpot_ms"] = m.tpot.median_ms;
  g["p99_tpot_ms"] = m.tpot.at(99);
  g["median_e2el_ms"] = m.e2el.median_ms;
  return g;
}

std::string fixed3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}

}  // namespace

ordered_json fault_json(const SimResult& r) {
  ordered_json j;
  ordered_json list = ordered_json::array();
  int64_t moved = 0, tokens = 0;
  const auto id_or_null = [](uint64_t id) { return id > 0 ? ordered_json(id) : ordered_json(nullptr); };
  const auto s_or_null = [](int64_t ns) { return ns >= 0 ? ordered_json(s(ns)) : ordered_json(nullptr); };
  for (const FaultReport& f : r.faults) {
    ordered_json e = {{"kind", to_string(f.fault.kind)},
                      {"worker", f.fault.kind == FaultKind::kAdd ? id_or_null(f.fault.worker)
                                                                 : ordered_json(f.fault.worker)},
                      {"at_s", s(f.fault.at_ns)},
                      {"removed_s", s_or_null(f.removed_ns)},
                      {"requests_moved", f.requests_moved},
                      {"tokens_recomputed", f.tokens_recomputed}};
    if (f.fault.kind == FaultKind::kCut) e["for_s"] = s(f.fault.duration_ns);
    if (f.fault.kind == FaultKind::kCut || f.fault.kind == FaultKind::kHang) {  // the worker may come back
      e["returned_s"] = s_or_null(f.returned_ns);
      e["new_worker"] = id_or_null(f.new_worker);
    }
    if (f.fault.kind == FaultKind::kAdd) e["node"] = f.fault.add ? f.fault.add->node : "";
    list.push_back(std::move(e));
    moved += f.requests_moved;
    tokens += f.tokens_recomputed;
  }
  j["faults"] = std::move(list);
  j["requests_moved"] = moved;
  j["tokens_recomputed"] = tokens;
  j["affected"] = group_json(r, true);
  j["unaffected"] = group_json(r, false);
  return j;
}

std::string format_fault_summary(const SimResult& r) {
  if (r.faults.empty()) return {};
  const ordered_json j = fault_json(r);
  std::string out = "--------------------- Faults ---------------------\n";
  char line[512];
  for (const auto& f : j["faults"]) {
    const std::string kind = f["kind"].get<std::string>();
    const auto at = [&](const char* key) { return fixed3(f[key].get<double>()) + " s"; };
    if (kind == "add") {
      const std::string id =
          f["worker"].is_null() ? "-" : std::to_string(f["worker"].get<unsigned long long>());
      std::snprintf(line, sizeof line, "add   worker %s at %.3f s: node %s joins\n", id.c_str(),
                    f["at_s"].get<double>(), f["node"].get<std::string>().c_str());
      out += line;
      continue;
    }
    const bool back_as_new = f.contains("new_worker") && !f["new_worker"].is_null();
    const std::string back_as =
        back_as_new ? "back as worker " + std::to_string(f["new_worker"].get<unsigned long long>()) + " at " +
                          at("returned_s")
                    : "";
    std::string what;
    if (kind == "cut") {
      what = "link down for " + at("for_s") + ", ";
      if (!f["removed_s"].is_null()) what += "gone at " + at("removed_s") + ", ";
      if (back_as_new)
        what += back_as;
      else
        what += f["returned_s"].is_null() ? "not back by the end" : "back at " + at("returned_s");
    } else {
      what = f["removed_s"].is_null() ? "still on the head's books" : "gone at " + at("removed_s");
      if (back_as_new) what += ", " + back_as;
    }
    std::snprintf(line, sizeof line,
                  "%-5s worker %llu at %.3f s: %s, %d requests moved, %lld tokens recomputed\n", kind.c_str(),
                  f["worker"].get<unsigned long long>(), f["at_s"].get<double>(), what.c_str(),
                  f["requests_moved"].get<int>(), f["tokens_recomputed"].get<long long>());
    out += line;
  }
  for (const char* g : {"affected", "unaffected"}) {
    const ordered_json& x = j[g];
    if (x["requests"].get<size_t>() == 0 || !x.contains("median_ttft_ms")) {
      std::snprintf(line, sizeof line, "%-10s requests: %zu\n", g, x["requests"].get<size_t>());
    } else {
      std::snprintf(line, sizeof line,
                    "%-10s requests: %zu | TTFT median %.1f ms, p99 %.1f ms | TPOT median %.2f ms, p99 %.2f ms | "
                    "E2EL median %.1f ms\n",
                    g, x["requests"].get<size_t>(), x["median_ttft_ms"].get<double>(),
                    x["p99_ttft_ms"].get<double>(), x["median_tpot_ms"].get<double>(),
                    x["p99_tpot_ms"].get<double>(), x["median_e2el_ms"].get<double>());
    }
    out += line;
  }
  return out;
}

std::string format_cluster_summary(const SimResult& r, size_t max_rows) {
  std::string out;
  char line[512];
  out += "-------------------- Cluster ---------------------\n";
  std::snprintf(line, sizeof line, "%-8s %-14s %6s %8s %9s %8s %8s %8s\n", "worker", "node", "util", "steps",
                "tokens", "kv mean", "kv peak", "preempt");
  out += line;
  double util = 0;
  int64_t pre = 0, tokens = 0, hit = 0, query = 0;
  for (size_t k = 0; k < r.workers.size(); ++k) {
    const WorkerReport& w = r.workers[k];
    util += utilization(w, r);
    pre += w.preemptions;
    tokens += w.tokens_generated;
    hit += w.prefix_hit_tokens;
    query += w.prefix_query_tokens;
    if (k < max_rows) {
      std::snprintf(line, sizeof line, "%-8llu %-14.14s %5.1f%% %8lld %9lld %7.1f%% %7.1f%% %8lld\n",
                    static_cast<unsigned long long>(w.id), w.node.c_str(), 100 * utilization(w, r),
                    static_cast<long long>(w.steps), static_cast<long long>(w.tokens_generated),
                    100 * w.mean_kv_use, w.num_blocks ? 100.0 * w.peak_blocks_used / w.num_blocks : 0.0,
                    static_cast<long long>(w.preemptions));
      out += line;
    }
  }
  if (r.workers.size() > max_rows) out += "... (" + std::to_string(r.workers.size() - max_rows) + " more)\n";
  int32_t peak_wait = 0;
  for (const auto& p : r.series) peak_wait = std::max(peak_wait, p.waiting);
  std::snprintf(line, sizeof line,
                "%zu workers: mean utilisation %.1f%%, %lld tokens, %lld preemptions, prefix cache %.1f%% of "
                "prompt tokens, peak queue %d, %d clipped\n",
                r.workers.size(), r.workers.empty() ? 0.0 : 100 * util / r.workers.size(),
                static_cast<long long>(tokens), static_cast<long long>(pre),
                query ? 100.0 * hit / query : 0.0, peak_wait, r.clipped);
  out += line;
  if (r.head_busy_ns > 0) {
    std::snprintf(line, sizeof line, "head: utilisation %.1f%% (busy %.3f s), longest wait for it %.3f ms\n",
                  100 * head_utilization(r), s(r.head_busy_ns), ms(r.head_max_wait_ns));
    out += line;
  }
  return out;
}

}  // namespace troupe::cluster::sim
