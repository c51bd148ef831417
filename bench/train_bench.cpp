// Training throughput: full training steps (forward + backward +
// AdamW) on 256-token sequences of moe-tiny and moe-small at 2 threads, as
// tokens/s, model FLOPs per token and the fraction of the FMA peak measured in
// the same run. One benchmark iteration is one whole measurement (a warm-up
// step and 2 timed steps of 32 sequences); the table printed at the end is the one
// `lockstep bench train` prints. LOCKSTEP_BENCH_THREADS overrides the threads.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "lockstep/bench/train.h"

namespace lockstep::perf {
namespace {

int threads() {
  const char* env = std::getenv("LOCKSTEP_BENCH_THREADS");
  return env && std::atoi(env) > 0 ? std::atoi(env) : 2;
}

Peak peak() {
  static const Peak p = measure_fma_peak(threads());
  return p;
}

std::vector<TrainBenchResult>& results() {
  static std::vector<TrainBenchResult> r;
  return r;
}

void BM_TrainStep(benchmark::State& state, const std::string& model) {
  TrainBenchOptions o;
  o.config_path = bench_config_path(model);
  o.threads = threads();
  for (auto _ : state) {
    const TrainBenchResult r = run_train_bench(o, peak());
    state.SetIterationTime(r.fwd_bwd_s + r.optim_s);
    state.counters["tokens/s"] = r.tokens_per_s;
    state.counters["MFLOP/token"] = r.flops_per_token * 1e-6;
    state.counters["GFLOP/s"] = r.gflops;
    state.counters["peak_GFLOP/s"] = r.peak.gflops();
    state.counters["frac_of_peak"] = r.gflops / r.peak.gflops();
    results().push_back(r);
  }
}

BENCHMARK_CAPTURE(BM_TrainStep, moe_tiny, std::string("moe-tiny"))
    ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainStep, moe_small, std::string("moe-small"))
    ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lockstep::perf

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  using namespace lockstep::perf;
  Table t = train_table();
  for (const auto& r : results()) add_row(t, r);
  std::cout << "\n" << t.str();
  return 0;
}
