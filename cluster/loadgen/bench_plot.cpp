#include "cluster/loadgen/bench_plot.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace troupe::cluster {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// gnuplot string literal (single quotes; a quote doubled).
std::string gp_string(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// Draws `body` (gnuplot commands after the terminal and output are set) as NAME.png and NAME.svg.
void draw(const std::filesystem::path& dir, const std::string& name, const std::string& size,
          const std::string& body) {
  const std::filesystem::path gp = dir / (name + ".gp");
  {
    std::ofstream out(gp);
    out << "# " << name << ": drawn by troupe bench --plot; run `gnuplot " << name << ".gp` in this folder\n"
        << "set terminal pngcairo size " << size << " font ',10'\nset output '" << name << ".png'\n"
        << body << "\nunset multiplot\nset terminal svg size " << size << " font 'sans,10'\nset output '"
        << name << ".svg'\n"
        << body << "\nunset multiplot\n";
    if (!out) throw std::runtime_error("cannot write " + gp.string());
  }
  const std::string cmd = "cd " + quoted(dir.string()) + " && gnuplot " + quoted(name + ".gp") + " 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    throw std::runtime_error("gnuplot failed on " + gp.string() +
                             " (is gnuplot installed? apt-get install gnuplot-nox)");
  }
}

std::vector<double> sorted_ms(std::vector<double> seconds) {
  for (double& v : seconds) v *= 1e3;
  std::sort(seconds.begin(), seconds.end());
  return seconds;
}

}  // namespace

void plot_run(const std::string& dir_name, const std::vector<core::RequestTiming>& requests,
              const std::string& title) {
  const std::filesystem::path dir(dir_name);
  std::filesystem::create_directories(dir);
  std::vector<double> ttft, tpot, itl, e2el;
  int64_t first = INT64_MAX, last = 0;
  for (const auto& r : requests) {
    if (!r.success) continue;
    const core::RequestLatency l = core::request_latency(r);
    ttft.push_back(l.ttft_s);
    if (r.output_tokens > 1) tpot.push_back(l.tpot_s);
    e2el.push_back(l.e2el_s);
    r.token_ns.for_each_gap([&](int64_t gap) { itl.push_back(gap / 1e9); });
    first = std::min(first, r.start_ns);
    last = std::max(last, r.end_ns);
  }
  if (e2el.empty()) throw std::runtime_error("nothing to plot: no request succeeded");
  {
    std::ofstream out(dir / "latency_cdf.dat");
    out << "# blocks (gnuplot index 0..3): TTFT, TPOT, ITL, E2EL; columns: ms, fraction of values <= ms\n";
    for (const auto* v : {&ttft, &tpot, &itl, &e2el}) {
      const std::vector<double> s = sorted_ms(*v);
      for (size_t i = 0; i < s.size(); ++i) out << s[i] << ' ' << double(i + 1) / s.size() << '\n';
      if (s.empty()) out << "0 0\n";
      out << "\n\n";
    }
  }
  std::string body = "set multiplot layout 2,2 title " + gp_string(title) +
                     "\nset grid\nset key off\nset ylabel 'fraction of values'\nset yrange [0:1]\n";
  const char* names[] = {"TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2EL (ms)"};
  for (int i = 0; i < 4; ++i) {
    body += std::string("set xlabel '") + names[i] + "'\nplot 'latency_cdf.dat' index " + std::to_string(i) +
            " using 1:2 with steps lw 2\n";
  }
  draw(dir, "latency_cdf", "1200,800", body);

  // Pieces per whole second, and requests in flight at each second's start.
  const size_t bins = static_cast<size_t>((last - first) / 1000000000) + 1;
  std::vector<int64_t> pieces(bins, 0), live(bins, 0);
  for (const auto& r : requests) {
    if (!r.success) continue;
    for (int64_t t : r.token_ns) ++pieces[std::min(bins - 1, static_cast<size_t>((t - first) / 1000000000))];
    for (size_t b = 0; b < bins; ++b) {
      const int64_t t = first + static_cast<int64_t>(b) * 1000000000;
      live[b] += r.start_ns <= t && t < r.end_ns;
    }
  }
  {
    std::ofstream out(dir / "throughput.dat");
    out << "# second since the first request, pieces (output tokens) received in it, requests in flight at "
           "its start\n";
    for (size_t b = 0; b < bins; ++b) out << b << ' ' << pieces[b] << ' ' << live[b] << '\n';
  }
  draw(dir, "throughput", "1200,500",
       "set title " + gp_string(title) +
           "\nset grid\nset xlabel 'time (s)'\nset ylabel 'output tokens/s'\nset y2label 'requests in "
           "flight'\n"
           "set ytics nomirror\nset y2tics\nset key top right\n"
           "plot 'throughput.dat' using 1:2 with steps lw 2 title 'output tokens/s', "
           "'' using 1:3 axes x1y2 with steps lw 1 dt 2 title 'in flight'");
}

void plot_sweep(const std::string& dir_name, const std::vector<SweepPoint>& points,
                const std::string& title) {
  const std::filesystem::path dir(dir_name);
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "sweep.dat");
    out << "# rate, output tok/s, median TPOT, p99 TPOT, median TTFT, p99 TTFT, median E2EL (ms)\n";
    for (const auto& p : points) {
      const auto& m = p.metrics;
      auto p99 = [](const core::LatencyStats& s) {
        for (const auto& [q, v] : s.percentiles_ms) {
          if (q == 99) return v;
        }
        return s.median_ms;
      };
      out << '"' << p.rate << "\" " << m.output_throughput << ' ' << m.tpot.median_ms << ' ' << p99(m.tpot)
          << ' ' << m.ttft.median_ms << ' ' << p99(m.ttft) << ' ' << m.e2el.median_ms << '\n';
    }
  }
  draw(dir, "sweep", "1200,500",
       "set multiplot layout 1,2 title " + gp_string(title) +
           "\nset grid\nset key top left\nset xlabel 'output tokens/s'\nset logscale y\n"
           "set ylabel 'TPOT (ms)'\n"
           "plot 'sweep.dat' using 2:3 with linespoints lw 2 title 'median', '' using 2:4 with linespoints "
           "lw 2 "
           "title 'p99', '' using 2:3:1 with labels offset 0,1 notitle\n"
           "set ylabel 'TTFT (ms)'\n"
           "plot 'sweep.dat' using 2:5 with linespoints lw 2 title 'median', '' using 2:6 with linespoints "
           "lw 2 "
           "title 'p99', '' using 2:5:1 with labels offset 0,1 notitle\n");
}

}  // namespace troupe::cluster
