#pragma once
// Workload: the requests a simulation (or a load test) sends, and when.
//
// Synthetic workloads follow vLLM's serving benchmark: inter-arrival gaps
// drawn from a gamma distribution with shape = burstiness and mean 1/rate
// (burstiness 1 = a Poisson process; < 1 burstier, > 1 more regular; rate
// infinite = everything at time 0, the closed-loop case once a concurrency
// limit is set in the simulator). Lengths come from a fixed value, a uniform
// range (vLLM's --random-range-ratio: [L(1-r), L(1+r)]), a lognormal with a
// given mean, or values sampled from a file. The same options and seed give
// the same list, on every machine (cluster/sim/random.hpp); arrivals, input
// lengths and output lengths draw from separate streams, so changing one
// leaves the others as they were.
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

struct WorkloadRequest {
  int64_t arrival_ns = 0;          // when the client sends it, from the run's start (0)
  int32_t input_len = 1;           // prompt tokens; >= 1
  int32_t output_len = 1;          // tokens to generate (max_tokens with ignore_eos); >= 1
  std::vector<uint64_t> hash_ids;  // trace prompt blocks (Mooncake): equal ids = equal token blocks;
                                   // empty = a prompt shared with no other request
};

enum class LengthKind { kFixed, kUniform, kLognormal, kFile };

struct LengthDistribution {
  LengthKind kind = LengthKind::kFixed;
  int32_t mean = 128;            // fixed: the length; uniform: the centre; lognormal: the mean; >= 1
  double range_ratio = 0;        // uniform: lengths in [mean(1-r), mean(1+r)]; [0, 1)
  double sigma = 0.5;            // lognormal: standard deviation of log(length); > 0
  std::vector<int32_t> samples;  // file: lengths drawn uniformly, with replacement
  std::string origin;            // file: its path (messages, reports)
};

// "128" or "fixed:128", "uniform:128:0.5", "lognormal:128:0.8", "file:PATH"
// (one positive integer per line; '#' starts a comment). Throws
// std::invalid_argument on a bad spec, std::runtime_error on a bad file
// (naming the line).
LengthDistribution parse_length_distribution(const std::string& spec);
// The spec parse_length_distribution reads back ("file:PATH" for a file).
std::string to_string(const LengthDistribution& d);

struct SyntheticOptions {
  int32_t num_requests = 100;  // >= 1
  double request_rate = 1.0;   // requests per second; > 0; infinity = all at time 0
  double burstiness = 1.0;     // gamma shape of the gaps; > 0; 1 = Poisson
  LengthDistribution input, output;
  uint64_t seed = 0;
};

// Throws std::invalid_argument on bad options. The first request goes at 0.
std::vector<WorkloadRequest> generate_synthetic(const SyntheticOptions& options);

// A copy with every arrival time multiplied by `factor` (> 0): 0.5 replays a
// trace at twice its rate.
std::vector<WorkloadRequest> scale_arrivals(std::vector<WorkloadRequest> requests, double factor);

}  // namespace troupe::cluster::sim
