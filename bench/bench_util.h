// Helpers shared by the microbenchmarks: the machine's measured fp32 FMA peak
// (to express results as a fraction of it), seeded random data and the
// GFLOP/s counter every compute benchmark reports.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "lockstep/bench/common.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

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

namespace detail {
// The FMA-chain kernel of the peak measurement is `lockstep bench`'s own.
using perf::detail::fma_chains;
using perf::detail::kFlopsPerIter;
}  // namespace detail

// Measured peak fp32 throughput in GFLOP/s of `threads` threads each running
// independent FMA chains in registers (best of a few short trials, all threads
// started together). This is the ceiling a GEMM can approach on this machine.
inline double measure_fma_peak_gflops(int threads, double seconds = 0.1, int trials = 5) {
  threads = std::max(1, threads);
  // Calibrate the iteration count on one thread.
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(detail::fma_chains(iters));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt >= seconds / 4 || iters >= (int64_t{1} << 34)) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(dt, 1e-9));
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int trial = 0; trial < trials; ++trial) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    std::vector<float> sink(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        sink[static_cast<size_t>(t)] = detail::fma_chains(iters);
      });
    while (ready.load() < threads) std::this_thread::yield();
    const auto t0 = std::chrono::steady_clock::now();
    go.store(true);
    for (auto& th : pool) th.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(sink.data());
    best = std::max(best, detail::kFlopsPerIter * static_cast<double>(iters) * threads / dt * 1e-9);
  }
  return best;
}

}  // namespace lockstep::bench
