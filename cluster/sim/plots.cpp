#include "cluster/sim/plots.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace troupe::cluster::sim {
namespace {

namespace fs = std::filesystem;

std::ofstream open(const fs::path& p) {
  std::ofstream out(p);
  if (!out) throw std::runtime_error("cannot write '" + p.string() + "'");
  out.precision(10);
  return out;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Writes NAME.gp drawing `body` once as PNG and once as SVG, and runs it.
std::vector<std::string> render(const fs::path& dir, const std::string& name, const std::string& body) {
  const std::string gnuplot = find_gnuplot();
  if (gnuplot.empty())
    throw std::runtime_error(
        "plots need gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)");
  const fs::path script = dir / (name + ".gp");
  {
    auto out = open(script);
    out << "# " << name << ": drawn by troupe simulate; run `gnuplot " << name << ".gp` here to redraw\n";
    out << "set terminal pngcairo size 1000,600 noenhanced\nset output '" << name << ".png'\n" << body;
    out << "reset\nset terminal svg size 1000,600 noenhanced\nset output '" << name << ".svg'\n" << body;
  }
  const std::string cmd =
      "cd " + quote(dir.string()) + " && " + quote(gnuplot) + " " + quote(name + ".gp") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
    throw std::runtime_error("gnuplot failed on " + script.string());
  return {(dir / (name + ".png")).string(), (dir / (name + ".svg")).string()};
}

void write_cdf(const fs::path& p, std::vector<double> v) {
  auto out = open(p);
  std::sort(v.begin(), v.end());
  // At most ~2000 points: enough for a smooth curve, small files.
  const size_t step = std::max<size_t>(1, v.size() / 2000);
  for (size_t i = 0; i < v.size(); i += step)
    out << v[i] << ' ' << static_cast<double>(i + 1) / v.size() << '\n';
  if (!v.empty()) out << v.back() << " 1\n";
}

}  // namespace

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  std::string p = path;
  size_t from = 0;
  while (from <= p.size()) {
    const size_t to = std::min(p.find(':', from), p.size());
    const fs::path cand = fs::path(p.substr(from, to - from)) / "gnuplot";
    std::error_code ec;
    if (fs::is_regular_file(cand, ec) && access(cand.c_str(), X_OK) == 0) return cand.string();
    from = to + 1;
  }
  return {};
}

std::vector<std::string> plot_simulation(const std::string& dir_name, const SimResult& r) {
  const fs::path dir(dir_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create '" + dir_name + "': " + ec.message());
  std::vector<double> ttft, tpot, e2el;
  for (const auto& t : r.requests) {
    if (!t.success || t.token_ns.empty()) continue;
    ttft.push_back((t.token_ns.front() - t.start_ns) / 1e6);
    e2el.push_back((t.end_ns - t.start_ns) / 1e6);
    if (t.output_tokens > 1) tpot.push_back((t.end_ns - t.token_ns.front()) / 1e6 / (t.output_tokens - 1));
  }
  write_cdf(dir / "ttft_cdf.dat", ttft);
  write_cdf(dir / "tpot_cdf.dat", tpot);
  write_cdf(dir / "e2el_cdf.dat", e2el);
  {
    auto out = open(dir / "series.dat");
    out << "# t_s output_tokens_per_s waiting running client_queue kv_mean kv_max busy_mean\n";
    int64_t prev = 0;
    for (const auto& p : r.series) {
      const double span = std::max(1e-9, (p.t_ns - prev) / 1e9);
      prev = p.t_ns;
      double kv_sum = 0, kv_max = 0, busy = 0;
      for (size_t k = 0; k < p.workers.size(); ++k) {
        const double kv = static_cast<double>(p.workers[k].blocks_used) / r.workers[k].num_blocks;
        kv_sum += kv;
        kv_max = std::max(kv_max, kv);
        busy += p.workers[k].busy;
      }
      const double n = std::max<size_t>(1, p.workers.size());
      out << p.t_ns / 1e9 << ' ' << p.output_tokens / span << ' ' << p.waiting << ' ' << p.running << ' '
          << p.client_queue << ' ' << kv_sum / n << ' ' << kv_max << ' ' << busy / n << '\n';
    }
  }
  std::vector<std::string> images;
  auto add = [&](const std::vector<std::string>& v) { images.insert(images.end(), v.begin(), v.end()); };
  add(render(dir, "latency_cdf",
             "set multiplot layout 1,3 title 'Latency CDFs'\nset grid\nset ylabel 'fraction of requests'\n"
             "set yrange [0:1]\nset key bottom right\n"
             "set xlabel 'TTFT (ms)'\nplot 'ttft_cdf.dat' using 1:2 with lines lw 2 title 'TTFT'\n"
             "set xlabel 'TPOT (ms)'\nplot 'tpot_cdf.dat' using 1:2 with lines lw 2 title 'TPOT'\n"
             "set xlabel 'E2EL (ms)'\nplot 'e2el_cdf.dat' using 1:2 with lines lw 2 title 'E2EL'\n"
             "unset multiplot\n"));
  add(render(dir, "throughput_queue",
             "set title 'Throughput and queue over time'\nset grid\nset xlabel 'time (s)'\n"
             "set ylabel 'output tokens/s'\nset y2label 'requests'\nset y2tics\nset ytics nomirror\n"
             "set yrange [0:*]\nset y2range [0:*]\n"
             "plot 'series.dat' using 1:2 with lines lw 2 title 'output tokens/s', "
             "'' using 1:3 axes x1y2 with lines title 'waiting (queue)', "
             "'' using 1:4 axes x1y2 with lines title 'running', "
             "'' using 1:5 axes x1y2 with lines title 'held by clients'\n"));
  add(render(dir, "kv_use",
             "set title 'KV cache use and busy time over workers'\nset grid\nset xlabel 'time (s)'\n"
             "set ylabel 'fraction'\nset yrange [0:1.05]\n"
             "plot 'series.dat' using 1:6 with lines lw 2 title 'KV use, mean', "
             "'' using 1:7 with lines title 'KV use, max', '' using 1:8 with lines title 'busy, mean'\n"));
  return images;
}

std::vector<std::string> plot_sweep(const std::string& dir_name, const std::vector<SweepPoint>& points) {
  const fs::path dir(dir_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create '" + dir_name + "': " + ec.message());
  {
    auto out = open(dir / "sweep.dat");
    out << "# rate median_ttft_ms p99_ttft_ms median_tpot_ms p99_tpot_ms request_throughput attainment\n";
    for (const auto& p : points) {
      const auto pct = [](const core::LatencyStats& s) {
        return s.percentiles_ms.empty() ? s.median_ms : s.percentiles_ms.back().second;
      };
      out << p.rate << ' ' << p.metrics.ttft.median_ms << ' ' << pct(p.metrics.ttft) << ' '
          << p.metrics.tpot.median_ms << ' ' << pct(p.metrics.tpot) << ' ' << p.metrics.request_throughput
          << ' ' << p.attainment << '\n';
    }
  }
  return render(
      dir, "latency_vs_load",
      "set multiplot layout 1,2 title 'Latency against load'\nset grid\nset xlabel 'request rate (req/s)'\n"
      "set ylabel 'ms'\nset logscale y\n"
      "plot 'sweep.dat' using 1:2 with linespoints title 'TTFT median', '' using 1:3 with linespoints "
      "title 'TTFT (highest percentile)', '' using 1:4 with linespoints title 'TPOT median', '' using 1:5 "
      "with linespoints title 'TPOT (highest percentile)'\n"
      "unset logscale y\nset ylabel 'fraction within SLOs'\nset yrange [0:1.05]\n"
      "plot 'sweep.dat' using 1:7 with linespoints lw 2 title 'SLO attainment'\n"
      "unset multiplot\n");
}

}  // namespace troupe::cluster::sim
