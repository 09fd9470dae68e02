#pragma once
// Random: the simulator's seeded generator and the distributions it draws
// from. Every draw is computed here (xoshiro256** seeded through splitmix64;
// Marsaglia-Tsang gamma; polar-method normals), not by <random>'s
// distributions, whose algorithms differ between standard libraries: a seed
// gives the same workload wherever troupe is built (up to the last bit of
// libm's log/exp).
#include <cstdint>

namespace troupe::cluster::sim {

class Random {
 public:
  explicit Random(uint64_t seed);

  uint64_t next();                              // 64 uniform bits (xoshiro256**, Blackman & Vigna 2018)
  double uniform();                             // [0, 1), 53 bits
  double uniform_open();                        // (0, 1): safe under log()
  int64_t uniform_int(int64_t lo, int64_t hi);  // [lo, hi], lo <= hi; unbiased (rejection)
  double normal();                              // N(0, 1), Marsaglia's polar method
  double exponential(double rate);              // mean 1/rate; rate > 0
  // Gamma(shape k, scale theta), mean k*theta (Marsaglia & Tsang 2000; k < 1
  // by the boost U^(1/k)). k > 0, theta > 0.
  double gamma(double shape, double scale);
  double lognormal(double mu, double sigma);  // exp(N(mu, sigma^2))

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace troupe::cluster::sim
