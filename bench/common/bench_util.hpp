#pragma once
// What every benchmark here does alike: time, summarise, and pick the kernel
// variants to compare.
#include <chrono>
#include <string>
#include <vector>

#include "model/cpu_features.hpp"

namespace troupe::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Stats {
  double best = 0, median = 0;
};

// Best and median of a non-empty sample.
Stats stats(std::vector<double> v);

// "avx512,avx2" -> the variants, in that order. Throws std::invalid_argument
// for an unknown name or one this CPU cannot run (the message says why).
std::vector<model::CpuIsa> parse_variants(const std::string& list);
// "a,b,c" -> {"a", "b", "c"} (an empty item stays: the parser it goes to names it).
std::vector<std::string> split_commas(const std::string& list);

// The packed-kernel variants this CPU runs, best first (avx512, avx2).
std::vector<model::CpuIsa> vector_variants();

}  // namespace troupe::bench
