#include "cluster/sim/trace_reader.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cluster/sim/parse_number.hpp"

namespace troupe::cluster::sim {
namespace {

constexpr double kNsPerS = 1e9;

struct Row {
  int64_t time_ns;
  int64_t input, output;
  std::vector<uint64_t> hash_ids;
};

class LineError {
 public:
  LineError(const std::string& origin, int64_t line) : where_(origin + ":" + std::to_string(line) + ": ") {}
  [[noreturn]] void operator()(const std::string& what) const { throw std::runtime_error(where_ + what); }

 private:
  std::string where_;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// One CSV record (RFC 4180 quoting within a line).
std::vector<std::string> csv_fields(const std::string& line, const LineError& err) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (quoted) err("unterminated quoted field");
  out.push_back(trim(cur));
  return out;
}

int64_t parse_count(const std::string& text, const std::string& column, const LineError& err) {
  const auto v = parse_number(text);
  if (!v || *v < 0 || std::floor(*v) != *v || *v > std::numeric_limits<int32_t>::max())
    err(column + " '" + text + "' is not a non-negative integer");
  return static_cast<int64_t>(*v);
}

double parse_seconds(const std::string& text, const std::string& column, const LineError& err) {
  const auto v = parse_number(text);
  if (!v || *v < 0) err(column + " '" + text + "' is not a non-negative number");
  return *v;
}

// Days from 1970-01-01 to y-m-d (proleptic Gregorian; Hinnant's days_from_civil).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// "2023-11-16 18:15:46.6805900", "2024-05-10 00:00:00.009930+00:00", "...T...Z",
// or plain seconds. Nanoseconds since the epoch (or since 0).
int64_t parse_azure_time(const std::string& s, const LineError& err) {
  if (s.find('-') == std::string::npos || s.size() < 19) {
    return static_cast<int64_t>(std::llround(parse_seconds(s, "TIMESTAMP", err) * kNsPerS));
  }
  auto digits = [&](size_t at, size_t n) {
    int64_t v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (i >= s.size() || s[i] < '0' || s[i] > '9')
        err("TIMESTAMP '" + s + "' is not YYYY-MM-DD HH:MM:SS[.f]");
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  if (s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T') || s[13] != ':' || s[16] != ':')
    err("TIMESTAMP '" + s + "' is not YYYY-MM-DD HH:MM:SS[.f]");
  const int64_t y = digits(0, 4), mo = digits(5, 2), d = digits(8, 2), h = digits(11, 2), mi = digits(14, 2),
                sec = digits(17, 2);
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
    err("TIMESTAMP '" + s + "' is not a valid date and time");
  int64_t ns = 0;
  size_t i = 19;
  if (i < s.size() && s[i] == '.') {
    int64_t scale = 100'000'000;
    for (++i; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
      ns += (s[i] - '0') * scale;
      scale /= 10;
    }
  }
  int64_t offset_s = 0;
  if (i < s.size()) {
    if (s[i] == 'Z' && i + 1 == s.size()) {
      ++i;
    } else if ((s[i] == '+' || s[i] == '-') && s.size() == i + 6 && s[i + 3] == ':') {
      offset_s = (digits(i + 1, 2) * 3600 + digits(i + 4, 2) * 60) * (s[i] == '+' ? 1 : -1);
      i = s.size();
    } else {
      err("TIMESTAMP '" + s + "' has unexpected text after the time");
    }
  }
  const int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - offset_s;
  return secs * 1'000'000'000 + ns;
}

using ColumnMap = std::map<std::string, size_t>;

size_t column(const ColumnMap& cols, const std::string& name, const std::string& origin, const char* format) {
  auto it = cols.find(name);
  if (it == cols.end())
    throw std::runtime_error(origin + ":1: the " + std::string(format) + " header has no '" + name +
                             "' column");
  return it->second;
}

void read_csv(std::istream& in, const std::string& origin, TraceFormat format, const TraceOptions& o,
              std::vector<Row>& rows, Trace& trace) {
  std::string line;
  int64_t n = 0;
  ColumnMap cols;
  while (std::getline(in, line)) {
    ++n;
    if (trim(line).empty()) continue;
    LineError err(origin, n);
    auto fields = csv_fields(line, err);
    if (cols.empty()) {
      for (size_t i = 0; i < fields.size(); ++i) cols[fields[i]] = i;
      break;
    }
  }
  if (cols.empty()) throw std::runtime_error(origin + ": the file is empty (no header row)");
  const bool azure = format == TraceFormat::kAzure;
  const char* fname = azure ? "Azure" : "BurstGPT";
  const std::string tname = azure ? "TIMESTAMP" : "Timestamp",
                    iname = azure ? "ContextTokens" : "Request tokens",
                    oname = azure ? "GeneratedTokens" : "Response tokens";
  const size_t tc = column(cols, tname, origin, fname), ic = column(cols, iname, origin, fname),
               oc = column(cols, oname, origin, fname);
  const size_t need = std::max({tc, ic, oc}) + 1;
  while (std::getline(in, line)) {
    ++n;
    if (trim(line).empty()) continue;
    if (o.max_requests > 0 && trace.rows >= o.max_requests) break;
    LineError err(origin, n);
    const auto f = csv_fields(line, err);
    if (f.size() < need)
      err("expected " + std::to_string(cols.size()) + " columns, found " + std::to_string(f.size()));
    Row r;
    r.time_ns = azure ? parse_azure_time(f[tc], err)
                      : static_cast<int64_t>(std::llround(parse_seconds(f[tc], tname, err) * kNsPerS));
    r.input = parse_count(f[ic], iname, err);
    r.output = parse_count(f[oc], oname, err);
    ++trace.rows;
    rows.push_back(std::move(r));
  }
}

void read_mooncake(std::istream& in, const std::string& origin, const TraceOptions& o, std::vector<Row>& rows,
                   Trace& trace) {
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (trim(line).empty()) continue;
    if (o.max_requests > 0 && trace.rows >= o.max_requests) break;
    LineError err(origin, n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      err(std::string("not JSON: ") + e.what());
    }
    if (!j.is_object()) err("a line must be a JSON object");
    auto count = [&](const char* key) -> int64_t {
      if (!j.contains(key)) err(std::string("missing \"") + key + "\"");
      const auto& v = j[key];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() > std::numeric_limits<int32_t>::max())
        err(std::string("\"") + key + "\" must be a non-negative integer");
      return v.get<int64_t>();
    };
    if (!j.contains("timestamp")) err("missing \"timestamp\"");
    if (!j["timestamp"].is_number() || !(j["timestamp"].get<double>() >= 0))
      err("\"timestamp\" must be a non-negative number of milliseconds");
    Row r;
    r.time_ns = static_cast<int64_t>(std::llround(j["timestamp"].get<double>() * 1e6));
    r.input = count("input_length");
    r.output = count("output_length");
    if (j.contains("hash_ids")) {
      const auto& h = j["hash_ids"];
      if (!h.is_array()) err("\"hash_ids\" must be an array of non-negative integers");
      for (const auto& v : h) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0)
          err("\"hash_ids\" must be an array of non-negative integers");
        r.hash_ids.push_back(v.get<uint64_t>());
      }
      const int64_t blocks = (r.input + o.mooncake_block_tokens - 1) / o.mooncake_block_tokens;
      if (static_cast<int64_t>(r.hash_ids.size()) > blocks)
        err(std::to_string(r.hash_ids.size()) + " hash_ids for " + std::to_string(r.input) +
            " input tokens: more than one per " + std::to_string(o.mooncake_block_tokens) + "-token block");
    }
    ++trace.rows;
    rows.push_back(std::move(r));
  }
}

}  // namespace

TraceFormat parse_trace_format(const std::string& text) {
  if (text == "azure") return TraceFormat::kAzure;
  if (text == "burstgpt") return TraceFormat::kBurstGpt;
  if (text == "mooncake") return TraceFormat::kMooncake;
  throw std::invalid_argument("trace format must be azure, burstgpt or mooncake, got '" + text + "'");
}

const char* to_string(TraceFormat format) {
  switch (format) {
    case TraceFormat::kAzure:
      return "azure";
    case TraceFormat::kBurstGpt:
      return "burstgpt";
    case TraceFormat::kMooncake:
      return "mooncake";
  }
  return "?";
}

Trace read_trace(std::istream& in, const std::string& origin, TraceFormat format, const TraceOptions& o) {
  if (o.mooncake_block_tokens < 1) throw std::invalid_argument("mooncake_block_tokens must be >= 1");
  if (o.max_requests < 0) throw std::invalid_argument("max_requests must be >= 0");
  Trace trace;
  std::vector<Row> rows;
  if (format == TraceFormat::kMooncake) {
    read_mooncake(in, origin, o, rows, trace);
  } else {
    read_csv(in, origin, format, o, rows, trace);
  }
  int64_t t0 = 0;
  bool first = true;
  for (const Row& r : rows) {
    if (r.input == 0 || r.output == 0) continue;
    t0 = first ? r.time_ns : std::min(t0, r.time_ns);
    first = false;
  }
  for (Row& r : rows) {
    if (r.input == 0 || r.output == 0) {
      ++trace.skipped;
      continue;
    }
    WorkloadRequest w;
    w.arrival_ns = r.time_ns - t0;
    w.input_len = static_cast<int32_t>(r.input);
    w.output_len = static_cast<int32_t>(r.output);
    w.hash_ids = std::move(r.hash_ids);
    trace.requests.push_back(std::move(w));
  }
  std::stable_sort(
      trace.requests.begin(), trace.requests.end(),
      [](const WorkloadRequest& a, const WorkloadRequest& b) { return a.arrival_ns < b.arrival_ns; });
  return trace;
}

Trace read_trace(const std::string& path, TraceFormat format, const TraceOptions& o) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read trace '" + path + "'");
  return read_trace(in, path, format, o);
}

}  // namespace troupe::cluster::sim
