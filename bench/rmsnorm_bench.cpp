// RMSNorm forward throughput in GB/s (bytes of x and w read, y and rstd
// written) for T in {1, 64, 1024} tokens, D in {256, 1024, 4096}, 1 or 2 threads.
// Run: build/<dir>/bench_rmsnorm [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/rmsnorm.h"

namespace {

using lockstep::Context;
using lockstep::DType;
using lockstep::Tensor;
using lockstep::ThreadPool;

void BM_RmsNormForward(benchmark::State& state) {
  const int64_t T = state.range(0), D = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  std::mt19937 g(1);
  std::normal_distribution<float> n;
  std::vector<float> x(static_cast<size_t>(T * D)), y(x.size()), w(static_cast<size_t>(D)),
      r(static_cast<size_t>(T));
  for (auto& v : x) v = n(g);
  for (auto& v : w) v = n(g);
  auto pool = std::make_unique<ThreadPool>(threads);
  Context ctx{pool.get()};
  Tensor xt(x.data(), DType::F32, {T, D}), yt(y.data(), DType::F32, {T, D});
  Tensor wt(w.data(), DType::F32, {D}), rt(r.data(), DType::F32, {T});
  for (auto _ : state) {
    lockstep::kernels::rmsnorm_forward(ctx, yt, rt, xt, wt, 1e-6f);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const int64_t bytes = (2 * T * D + D + T) * static_cast<int64_t>(sizeof(float));
  state.SetBytesProcessed(state.iterations() * bytes);
}

BENCHMARK(BM_RmsNormForward)
    ->ArgNames({"T", "D", "threads"})
    ->ArgsProduct({{1, 64, 1024}, {256, 1024, 4096}, {1, 2}})
    ->UseRealTime();  // wall time: CPU time would count only the calling thread

}  // namespace

BENCHMARK_MAIN();
