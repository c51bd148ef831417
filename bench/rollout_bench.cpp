// Rollout-engine throughput on moe-tiny and moe-small at 2 threads:
// decode tokens/s at batch 1, 16, 64, 256 beside the roofline (the larger of
// the step's FLOPs at the FMA peak and its weight and KV bytes at the
// measured read bandwidth), prefill tokens/s, and a GRPO-shaped
// workload (64 prompts x 8 samples) with and without prefix sharing. One
// benchmark iteration is one whole measurement; the tables printed at the end
// are those of `lockstep bench rollout`. LOCKSTEP_BENCH_THREADS overrides the threads.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "lockstep/bench/rollout.h"

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

std::vector<RolloutBenchResult>& results() {
  static std::vector<RolloutBenchResult> r;
  return r;
}

void BM_Rollout(benchmark::State& state, const std::string& model) {
  RolloutBenchOptions o;
  o.config_path = bench_config_path(model);
  o.threads = threads();
  for (auto _ : state) {
    const RolloutBenchResult r = run_rollout_bench(o, peak());
    state.SetIterationTime(r.grpo_shared.seconds);
    for (const auto& d : r.decode) {
      const std::string b = std::to_string(d.batch);
      state.counters["decode_tok/s@" + b] = d.tokens_per_s;
      state.counters["roofline_frac@" + b] = d.tokens_per_s / d.roofline_tokens_per_s;
    }
    state.counters["prefill_tok/s"] = r.prefill_tokens_per_s;
    state.counters["grpo_shared_tok/s"] = r.grpo_shared.tokens_per_s();
    state.counters["grpo_unshared_tok/s"] = r.grpo_unshared.tokens_per_s();
    results().push_back(r);
  }
}

BENCHMARK_CAPTURE(BM_Rollout, moe_tiny, std::string("moe-tiny"))
    ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Rollout, moe_small, std::string("moe-small"))
    ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lockstep::perf

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::cout << "\n" << lockstep::perf::rollout_tables(lockstep::perf::results());
  return 0;
}
