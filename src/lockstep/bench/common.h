// Shared by `lockstep bench` (cmd_bench.cpp) and the Google Benchmark targets
// bench/train_bench.cpp and bench/rollout_bench.cpp, so both print the same
// tables: the machine's measured fp32 FMA peak, model FLOPs per token counted
// from the architecture, benchmark model loading and a plain-text table.
// Header-only because the bench targets and the CLI are separate binaries.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <ctime>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "lockstep/model/config.h"
#include "lockstep/model/params.h"

namespace lockstep::perf {

// Keeps a value alive without letting the compiler see through it.
template <typename T>
inline void keep(const T& v) {
  asm volatile("" : : "g"(&v) : "memory");
}

namespace detail {
// `iters` rounds of 12 independent 8-wide FMA chains: 12 chains cover two FMA
// ports times a 4-6 cycle latency, so the loop runs at the FMA throughput
// limit (the same method as bench/bench_util.h).
inline float fma_chains(int64_t iters) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  // acc = acc * m + c converges to c / (1 - m): no overflow, no subnormals.
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, c);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
#else
  float acc[12][8];
  for (int i = 0; i < 12; ++i)
    for (int j = 0; j < 8; ++j) acc[i][j] = static_cast<float>(i);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i)
      for (int j = 0; j < 8; ++j) acc[i][j] = std::fma(acc[i][j], 0.999999f, 1e-3f);
  float s = 0;
  for (int i = 0; i < 12; ++i) s += acc[i][0];
  return s;
#endif
}
constexpr double kFlopsPerIter = 12 * 8 * 2;
}  // namespace detail

// Seconds of CPU time used by this process (all threads) so far.
inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The machine's fp32 FMA peak at some thread count, two ways:
//   wall: FLOPs per wall second of all threads started together;
//   cpu:  FLOPs per CPU second of one thread, times the thread count: what
//         the threads reach while they hold a core.
// On an idle machine the two agree. On a machine shared with other jobs the
// wall figure drops with whatever else runs, the cpu one does not, so the
// tables use the cpu figure as "the peak" (the ceiling of the hardware).
struct Peak {
  int threads = 1;
  double wall_gflops = 0;
  double cpu_gflops = 0;
  double gflops() const { return std::max(wall_gflops, cpu_gflops); }
};

// Threads each running register-resident FMA chains, started together; best
// of `trials` trials of about `seconds` each. Best-of rather than mean: on a
// shared machine the quietest trial is the closest to what the hardware can do.
inline Peak measure_fma_peak(int threads, double seconds = 0.1, int trials = 5) {
  Peak pk;
  pk.threads = threads = std::max(1, threads);
  int64_t iters = 1 << 16;
  for (;;) {  // calibrate the iteration count on one thread
    const auto t0 = std::chrono::steady_clock::now();
    keep(detail::fma_chains(iters));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt >= seconds / 4 || iters >= (int64_t{1} << 34)) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(dt, 1e-9));
      break;
    }
    iters *= 4;
  }
  const double flops = detail::kFlopsPerIter * static_cast<double>(iters);
  for (int trial = 0; trial < trials; ++trial) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    std::vector<float> sink(static_cast<size_t>(threads));
    std::vector<double> cpu(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        const double c0 = thread_cpu_seconds();
        sink[static_cast<size_t>(t)] = detail::fma_chains(iters);
        cpu[static_cast<size_t>(t)] = thread_cpu_seconds() - c0;
      });
    while (ready.load() < threads) std::this_thread::yield();
    const auto t0 = std::chrono::steady_clock::now();
    go.store(true);
    for (auto& th : pool) th.join();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    keep(sink);
    pk.wall_gflops = std::max(pk.wall_gflops, flops * threads / dt * 1e-9);
    for (double c : cpu) pk.cpu_gflops = std::max(pk.cpu_gflops, flops / std::max(c, 1e-9) * threads * 1e-9);
  }
  return pk;
}

// Parameters a token passes through in matrix products: attention
// projections, router, its K routed experts (+ shared experts or the dense
// FFN) in every layer, and lm_head. The embedding lookup is not a product.
inline double active_matmul_params(const ModelConfig& c) {
  const double D = double(c.hidden_size);
  double n = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    n += D * double((c.num_heads + 2 * c.num_kv_heads) * c.head_dim);  // wqkv
    n += double(c.q_dim()) * D;                                        // wo
    if (c.is_moe_layer(l)) {
      n += D * double(c.num_experts);                                                         // router
      n += double(c.num_experts_per_tok) * 3.0 * D * double(c.moe_intermediate_size);         // routed
      if (c.has_shared_expert()) n += 3.0 * D * double(c.shared_expert_intermediate_size);  // shared
      if (c.shared_expert_gate) n += D;
    } else {
      n += 3.0 * D * double(c.intermediate_size);
    }
  }
  n += D * double(c.vocab_size);  // lm_head
  return n;
}

// Attention score and value products per token of a forward, for sequences
// of length T: q·kᵀ and p·v are each 2·T·Dh FLOPs per head. Counted over the
// full T (the convention of PaLM's model-FLOPs utilisation), although the
// causal mask means the kernels do about half of it.
inline double attention_flops_per_token(const ModelConfig& c, int64_t T) {
  return double(c.num_layers) * 2.0 * 2.0 * double(T) * double(c.head_dim) * double(c.num_heads);
}

// Training FLOPs per token (forward + backward): 6 per active matmul
// parameter (2 forward, 4 backward: dX and dW) plus attention × 3 (the
// backward of each attention product costs two products).
inline double train_flops_per_token(const ModelConfig& c, int64_t T) {
  return 6.0 * active_matmul_params(c) + 3.0 * attention_flops_per_token(c, T);
}

// Forward-only FLOPs per token at context length T (decode, prefill).
inline double forward_flops_per_token(const ModelConfig& c, int64_t T) {
  return 2.0 * active_matmul_params(c) + attention_flops_per_token(c, T);
}

// "configs/bench/moe-tiny.toml" -> "moe-tiny".
inline std::string model_name(const std::string& config_path) {
  return std::filesystem::path(config_path).stem().string();
}

// The benchmark configs of this source tree, found from this header's path
// (benchmarks run from any directory); LOCKSTEP_BENCH_CONFIGS overrides.
inline std::string bench_config_path(const std::string& name) {
  if (const char* dir = std::getenv("LOCKSTEP_BENCH_CONFIGS")) return std::string(dir) + "/" + name + ".toml";
  return (std::filesystem::path(__FILE__).parent_path() / "../../../configs/bench" / (name + ".toml"))
      .lexically_normal()
      .string();
}

// Random f32 parameters for a benchmark model: the values do not change the
// cost, only the routing, and a fixed seed keeps the routing the same run to run.
inline Buffer bench_params(const ParamLayout& layout, const Context& ctx, uint64_t seed = 1) {
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), seed, 0.02f, &ctx);
  return p;
}

// A fixed-width text table: columns right-aligned to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const {
    std::vector<size_t> w;
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size(); ++i) {
        if (w.size() <= i) w.push_back(0);
        w[i] = std::max(w[i], r[i].size());
      }
    std::string out;
    for (size_t k = 0; k < rows_.size(); ++k) {
      const auto& r = rows_[k];
      for (size_t i = 0; i < r.size(); ++i) {
        out += std::string(w[i] - r[i].size() + (i ? 2 : 0), ' ');
        out += r[i];
      }
      out += "\n";
      if (k == 0) {
        size_t total = 0;
        for (size_t i = 0; i < w.size(); ++i) total += w[i] + (i ? 2 : 0);
        out += std::string(total, '-') + "\n";
      }
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// printf-style formatting of one cell.
template <typename... A>
inline std::string fmt(const char* f, A... a) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

}  // namespace lockstep::perf
