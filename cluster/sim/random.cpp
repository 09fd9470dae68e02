#include "cluster/sim/random.hpp"

#include <cmath>
#include <stdexcept>

#include "core/splitmix.hpp"

namespace troupe::cluster::sim {
namespace {

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Random::Random(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) {
    s = core::splitmix64(x);
    x += 0x9e3779b97f4a7c15ULL;
  }
}

uint64_t Random::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Random::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

double Random::uniform_open() {
  for (;;) {
    const double u = uniform();
    if (u > 0) return u;
  }
}

int64_t Random::uniform_int(int64_t lo, int64_t hi) {
  if (lo > hi) throw std::invalid_argument("Random::uniform_int: lo > hi");
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
  if (span == 0) return static_cast<int64_t>(next());  // the whole 64-bit range
  const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % span);
  for (;;) {
    const uint64_t x = next();
    if (x < limit) return lo + static_cast<int64_t>(x % span);
  }
}

double Random::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  for (;;) {
    const double u = 2 * uniform() - 1, v = 2 * uniform() - 1;
    const double s = u * u + v * v;
    if (s >= 1 || s == 0) continue;
    const double f = std::sqrt(-2 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }
}

double Random::exponential(double rate) {
  if (!(rate > 0)) throw std::invalid_argument("Random::exponential: rate must be > 0");
  return -std::log(uniform_open()) / rate;
}

double Random::gamma(double shape, double scale) {
  if (!(shape > 0) || !(scale > 0)) throw std::invalid_argument("Random::gamma: shape and scale must be > 0");
  if (shape < 1) {
    // Gamma(k) = Gamma(k + 1) * U^(1/k).
    const double g = gamma(shape + 1, 1.0);
    return g * std::pow(uniform_open(), 1.0 / shape) * scale;
  }
  const double d = shape - 1.0 / 3, c = 1 / std::sqrt(9 * d);
  for (;;) {
    double x, v;
    do {
      x = normal();
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = uniform_open();
    if (u < 1 - 0.0331 * x * x * x * x) return d * v * scale;
    if (std::log(u) < 0.5 * x * x + d * (1 - v + std::log(v))) return d * v * scale;
  }
}

double Random::lognormal(double mu, double sigma) { return std::exp(mu + sigma * normal()); }

}  // namespace troupe::cluster::sim
