// GEMM throughput: Y = X·Wᵀ with our pre-packed kernels (f32 and bf16 weights)
// beside OpenBLAS cblas_sgemm on the same shapes and thread count, plus the
// measured FMA peak; ends with a table of ratios and fractions of peak.
// Shapes: M in {1, 8, 64, 256, 1024} (decode to prefill), N = K in {256, 1024, 4096}.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/gemm.h"

#if defined(LOCKSTEP_HAVE_OPENBLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace lockstep::kernels {
namespace {

int bench_threads() { return default_thread_count(); }

// Passes over the grid (LOCKSTEP_BENCH_REPS, default 5); the best one is kept.
int bench_repetitions() {
  const char* env = std::getenv("LOCKSTEP_BENCH_REPS");
  const int n = env ? std::atoi(env) : 5;
  return n >= 1 ? n : 1;
}

ThreadPool& pool() {
  static ThreadPool p(bench_threads());
  return p;
}

// Operands per shape, built once and shared by the variants (W is 64 MiB at 4096).
struct Weights {
  std::vector<float> w;  // (N, K)
  PackedWeight f32, bf16;
};
Weights& weights(int64_t nk) {
  static std::map<int64_t, std::unique_ptr<Weights>> cache;
  auto& e = cache[nk];
  if (!e) {
    e = std::make_unique<Weights>();
    e->w = bench::random_floats(nk * nk, 2);
    const Tensor wt(e->w.data(), DType::F32, {nk, nk});
    const Context ctx{&pool()};
    e->f32 = pack_weight(ctx, wt, DType::F32);
    e->bf16 = pack_weight(ctx, wt, DType::BF16);
  }
  return *e;
}
std::vector<float>& input(int64_t m, int64_t k) {
  static std::map<std::pair<int64_t, int64_t>, std::vector<float>> cache;
  auto& v = cache[{m, k}];
  if (v.empty()) v = bench::random_floats(m * k, 1);
  return v;
}

enum Variant { kOursF32 = 0, kOursBf16 = 1, kOpenBlas = 2 };

void BM_Gemm(benchmark::State& state) {
  const int64_t M = state.range(0), NK = state.range(1);
  const auto variant = static_cast<Variant>(state.range(2));
  Weights& W = weights(NK);
  std::vector<float>& x = input(M, NK);
  std::vector<float> y(static_cast<size_t>(M * NK));
  const Context ctx{&pool()};
  const Tensor xt(x.data(), DType::F32, {M, NK});
  const Tensor yt(y.data(), DType::F32, {M, NK});
  for (auto _ : state) {
    switch (variant) {
      case kOursF32: gemm_xwt(ctx, yt, xt, W.f32); break;
      case kOursBf16: gemm_xwt(ctx, yt, xt, W.bf16); break;
      case kOpenBlas:
#if defined(LOCKSTEP_HAVE_OPENBLAS)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(NK),
                    static_cast<int>(NK), 1.0f, x.data(), static_cast<int>(NK), W.w.data(), static_cast<int>(NK), 0.0f,
                    y.data(), static_cast<int>(NK));
#else
        state.SkipWithError("built without OpenBLAS");
#endif
        break;
    }
    benchmark::ClobberMemory();
  }
  bench::set_gflops(state, 2.0 * static_cast<double>(M) * static_cast<double>(NK) * static_cast<double>(NK));
}

// The three products of a training step at Qwen3-0.6B's shapes (hidden
// 1,024, SwiGLU width 3,072, vocabulary 151,936), W read in place as the
// trainer does: Y = X·Wᵀ (a chain over the input width), dX = dY·W (over the
// output width), dW += dYᵀ·X (over the T tokens).
enum TrainOp { kXwt = 0, kDyw = 1, kDytx = 2 };
const char* kTrainOpNames[] = {"xwt", "dyw", "dytx"};

struct TrainShape {
  int op;
  int64_t t, n, k;
};
// The MLP's products at T = 4,096, and lm_head's input gradient for one
// 1,024-row logits chunk (a chain over the 151,936-entry vocabulary).
const TrainShape kTrainShapes[] = {
    {kXwt, 4096, 3072, 1024},  {kXwt, 4096, 1024, 3072},  {kDyw, 4096, 3072, 1024},  {kDyw, 4096, 1024, 3072},
    {kDytx, 4096, 3072, 1024}, {kDytx, 4096, 1024, 3072}, {kDyw, 1024, 151936, 1024}};

void BM_Train(benchmark::State& state) {
  const auto op = static_cast<TrainOp>(state.range(0));
  const int64_t T = state.range(1), N = state.range(2), K = state.range(3);  // W (N, K)
  static std::map<std::pair<int64_t, int64_t>, std::vector<float>> mats;
  auto mat = [&](int64_t r, int64_t c, uint64_t seed) -> std::vector<float>& {
    auto& v = mats[{r * 1000003 + c, int64_t(seed)}];
    if (v.empty()) v = bench::random_floats(r * c, seed);
    return v;
  };
  std::vector<float>& w = mat(N, K, 3);
  std::vector<float>& x = mat(T, K, 4);   // X (T, K)
  std::vector<float>& dy = mat(T, N, 5);  // Y and dY (T, N)
  std::vector<float> out(static_cast<size_t>(std::max(T * std::max(N, K), N * K)));
  const Context ctx{&pool()};
  const Tensor wt(w.data(), DType::F32, {N, K}), xt(x.data(), DType::F32, {T, K}),
      dyt(dy.data(), DType::F32, {T, N});
  const PackedWeight pw = in_place_weight(wt);
  for (auto _ : state) {
    switch (op) {
      case kXwt: gemm_xwt(ctx, Tensor(out.data(), DType::F32, {T, N}), xt, pw); break;
      case kDyw: gemm_dyw(ctx, Tensor(out.data(), DType::F32, {T, K}), dyt, wt); break;
      case kDytx: gemm_dytx(ctx, Tensor(out.data(), DType::F32, {N, K}), dyt, xt, false); break;
    }
    benchmark::ClobberMemory();
  }
  bench::set_gflops(state, 2.0 * static_cast<double>(T) * static_cast<double>(N) * static_cast<double>(K));
}

void BM_FmaPeak(benchmark::State& state) {
  double g = 0;
  for (auto _ : state) g = bench::measure_fma_peak_gflops(static_cast<int>(state.range(0)), 0.1, 8);
  state.counters["GFLOP/s"] = g;
}

const char* kVariantNames[] = {"ours_f32", "ours_bf16", "openblas"};

// The whole grid is registered `bench_repetitions()` times over (passes), so
// that a burst of load from other processes hits a few cells of one pass
// rather than every repetition of one variant; the summary keeps each cell's
// best pass, and ours and OpenBLAS get the same treatment.
void register_all() {
  for (int pass = 0; pass < bench_repetitions(); ++pass) {
    benchmark::RegisterBenchmark("FmaPeak", BM_FmaPeak)->Arg(1)->Arg(bench_threads())->Iterations(1)->UseRealTime();
    for (int64_t nk : {256, 1024, 4096})
      for (int64_t m : {1, 8, 64, 256, 1024})
        for (int v = 0; v < 3; ++v) {
          // ~0.1 s per case keeps a pass near ten seconds; the biggest shapes
          // (34 GFLOP per call) run one or two iterations regardless.
          const std::string name = std::string("Gemm/") + kVariantNames[v];
          benchmark::RegisterBenchmark(name.c_str(), BM_Gemm)
              ->Args({m, nk, v})
              ->ArgNames({"M", "NK", ""})
              ->MinTime(0.1)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
    for (const TrainShape& sh : kTrainShapes)
      benchmark::RegisterBenchmark((std::string("Train/") + kTrainOpNames[sh.op]).c_str(), BM_Train)
          ->Args({sh.op, sh.t, sh.n, sh.k})
          ->ArgNames({"", "T", "N", "K"})
          ->MinTime(0.1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }
}

// Console output as usual, plus the GFLOP/s of every case kept for the summary.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  // Every run is shown; the summary keeps the best of the passes.
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      auto it = r.counters.find("GFLOP/s");
      if (r.run_type != Run::RT_Iteration || it == r.counters.end()) continue;
      double& best = gflops_[r.run_name.function_name + "/" + r.run_name.args];
      best = std::max(best, it->second.value);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const int t = bench_threads();
    const std::string peak_name = "FmaPeak/" + std::to_string(t);
    const double peak = gflops_.count(peak_name) ? gflops_[peak_name] : 0.0;
    std::printf("\nGEMM Y = X·Wᵀ, %d thread(s); measured FMA peak %.1f GFLOP/s\n", t, peak);
    std::printf("%6s %6s | %10s %10s %10s | %9s %9s | %8s %8s\n", "M", "N=K", "ours f32", "ours bf16", "OpenBLAS",
                "f32/OB", "bf16/OB", "f32/peak", "bf16/pk");
    for (int64_t nk : {256, 1024, 4096})
      for (int64_t m : {1, 8, 64, 256, 1024}) {
        double g[3];
        for (int v = 0; v < 3; ++v) {
          const std::string key = std::string("Gemm/") + kVariantNames[v] + "/M:" + std::to_string(m) +
                                  "/NK:" + std::to_string(nk) + "/" + std::to_string(v);
          g[v] = gflops_.count(key) ? gflops_[key] : 0.0;
        }
        std::printf("%6lld %6lld | %10.1f %10.1f %10.1f | %9.2f %9.2f | %8.2f %8.2f\n", static_cast<long long>(m),
                    static_cast<long long>(nk), g[0], g[1], g[2], g[2] > 0 ? g[0] / g[2] : 0.0,
                    g[2] > 0 ? g[1] / g[2] : 0.0, peak > 0 ? g[0] / peak : 0.0, peak > 0 ? g[1] / peak : 0.0);
      }
    std::printf("\nTraining products, W (N, K) f32 in place\n%6s %6s %6s %6s | %10s %8s\n", "op", "T", "N",
                "K", "GFLOP/s", "of peak");
    for (const TrainShape& sh : kTrainShapes) {
      const std::string key = std::string("Train/") + kTrainOpNames[sh.op] + "/" + std::to_string(sh.op) +
                              "/T:" + std::to_string(sh.t) + "/N:" + std::to_string(sh.n) +
                              "/K:" + std::to_string(sh.k);
      const double g = gflops_.count(key) ? gflops_[key] : 0.0;
      std::printf("%6s %6lld %6lld %6lld | %10.1f %8.2f\n", kTrainOpNames[sh.op],
                  static_cast<long long>(sh.t), static_cast<long long>(sh.n), static_cast<long long>(sh.k), g,
                  peak > 0 ? g / peak : 0.0);
    }
  }

 private:
  std::map<std::string, double> gflops_;
};

}  // namespace
}  // namespace lockstep::kernels

int main(int argc, char** argv) {
#if defined(LOCKSTEP_HAVE_OPENBLAS)
  openblas_set_num_threads(lockstep::kernels::bench_threads());
#endif
  lockstep::kernels::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  lockstep::kernels::SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
