// Helpers shared by the microbenchmarks: the machine's measured fp32 FMA peak
// (to express results as a fraction of it), seeded random data and the
// GFLOP/s counter every compute benchmark reports.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "lockstep/bench/common.h"

namespace lockstep::bench {

// Normal(0, 1) floats from a fixed seed.
inline std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// Reports `flops_per_iter` as a rate counter "GFLOP/s" (use with UseRealTime so
// the rate is per wall second even when other threads do the work).
inline void set_gflops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iter * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

// Measured peak fp32 throughput in GFLOP/s of `threads` threads each running
// independent FMA chains in registers (best of a few short trials, all threads
// started together): `lockstep bench`'s measurement, its wall figure. This is
// the ceiling a GEMM can approach on this machine.
inline double measure_fma_peak_gflops(int threads, double seconds = 0.1, int trials = 5) {
  return perf::measure_fma_peak(threads, seconds, trials).wall_gflops;
}

}  // namespace lockstep::bench
