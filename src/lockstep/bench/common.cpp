// The benchmark helpers of common.h: the FMA-peak measurement (register-
// resident FMA chains on threads started together), FLOPs per token counted
// from the architecture, benchmark configs and parameters, the text table.
#include "lockstep/bench/common.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "lockstep/kernels/cpu/wide.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace lockstep::perf {
namespace {

// Keeps a value alive without letting the compiler see through it.
template <typename T>
void keep(const T& v) {
  asm volatile("" : : "g"(&v) : "memory");
}

// `iters` rounds of 12 independent 8-wide FMA chains: 12 chains cover two FMA
// ports times a 4-6 cycle latency, so the loop runs at the FMA throughput
// limit.
float fma_chains(int64_t iters) {
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

#if defined(__AVX2__) && defined(__FMA__)
// The same 12 chains on 16-wide vectors, for CPUs with AVX-512, where the f32
// GEMM runs on them (kernels::wide_vectors()): their peak is the
// machine's, up to twice the 8-wide one.
__attribute__((target("avx512f"))) float fma_chains_wide(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, c);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  return lanes[0];
}
#endif

// One loop of FMA chains and the flops of one of its iterations.
struct ChainLoop {
  float (*run)(int64_t iters);
  double flops_per_iter;
};

// Iterations of `loop` that take about `seconds` on one thread.
int64_t calibrate_iters(const ChainLoop& loop, double seconds) {
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    keep(loop.run(iters));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt >= seconds / 4 || iters >= (int64_t{1} << 34))
      return static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(dt, 1e-9));
    iters *= 4;
  }
}

}  // namespace

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

namespace {

// measure_fma_peak for one loop of chains.
Peak measure_loop_peak(const ChainLoop& loop, int threads, double seconds, int trials) {
  Peak pk;
  pk.threads = threads;
  const int64_t iters = calibrate_iters(loop, seconds);
  const double flops = loop.flops_per_iter * static_cast<double>(iters);
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
        sink[static_cast<size_t>(t)] = loop.run(iters);
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

}  // namespace

Peak measure_fma_peak(int threads, double seconds, int trials) {
  threads = std::max(1, threads);
  Peak pk = measure_loop_peak({&fma_chains, 12 * 8 * 2}, threads, seconds, trials);
#if defined(__AVX2__) && defined(__FMA__)
  if (kernels::wide_vectors()) {
    const Peak wide = measure_loop_peak({&fma_chains_wide, 12 * 16 * 2}, threads, seconds, trials);
    pk.wall_gflops = std::max(pk.wall_gflops, wide.wall_gflops);
    pk.cpu_gflops = std::max(pk.cpu_gflops, wide.cpu_gflops);
    pk.vector_width = 16;
  }
#endif
  return pk;
}

double measure_read_bandwidth(const Context& ctx, size_t bytes, int trials) {
  constexpr size_t kChunk = size_t(1) << 18;  // 256 KB a task
  const size_t chunks = std::max<size_t>(bytes / kChunk, 1), words = kChunk / sizeof(uint64_t);
  std::vector<uint64_t> buf(chunks * words);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;  // written once, so the pages are resident
  std::vector<uint64_t> sums(chunks, 0);
  double best = 0;
  for (int trial = 0; trial < trials + 1; ++trial) {  // the first pass only warms
    const auto t0 = std::chrono::steady_clock::now();
    ctx.parallel_for(
        int64_t(chunks),
        [&](int64_t c0, int64_t c1) {
          // The thread's range as kStreams runs read side by side, each
          // prefetched ahead: what a streaming kernel gets (one run per
          // thread read about 3/4 of it here), so the bound is not low.
          constexpr size_t kStreams = 4, kAhead = 128;  // words: 1 KiB
          const size_t n = size_t(c1 - c0) * words / kStreams;
          const uint64_t* base = buf.data() + size_t(c0) * words;
          uint64_t acc[kStreams][4] = {};
          for (size_t i = 0; i < n; i += 8) {
            for (size_t s = 0; s < kStreams; ++s) {
              const uint64_t* p = base + s * n + i;
              __builtin_prefetch(p + kAhead);
              for (size_t j = 0; j < 4; ++j) acc[s][j] += p[j] + p[j + 4];
            }
          }
          uint64_t total = 0;
          for (const auto& a : acc)
            for (uint64_t v : a) total += v;
          sums[size_t(c0)] = total;
        },
        1);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (trial > 0) best = std::max(best, double(chunks * kChunk) / std::max(dt, 1e-9) * 1e-9);
  }
  keep(sums);
  return best;
}

namespace {

// DeepSeek-V4's matrix parameters one token multiplies by (docs/deepseek-v4.md):
// low-rank q, the K = V head, the grouped output, compressors, the indexer,
// the mHC mixes, the router, K routed experts and the shared one, the head.
double v4_active_matmul_params(const ModelConfig& c) {
  const double D = double(c.hidden_size), Dh = double(c.head_dim), H = double(c.num_heads),
               Rq = double(c.q_lora_rank), Ro = double(c.o_lora_rank), G = double(c.o_groups),
               HI = double(c.index_n_heads), DI = double(c.index_head_dim), nD = double(c.hc_mult) * D,
               Fe = double(c.moe_intermediate_size);
  double n = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t ratio = c.compress_ratio(l);
    n += Rq * D + H * Dh * Rq + Dh * D + Ro * H * Dh + D * G * Ro;  // wq_a, wq_b, wkv, wo_a, wo_b
    if (ratio > 0) n += 2.0 * (ratio == 4 ? 2.0 : 1.0) * Dh * D;    // compressor wkv | wgate
    if (ratio == 4) n += HI * DI * Rq + HI * D + 4.0 * DI * D;      // indexer q, weights, compressor
    n += 2.0 * double(c.hc_mix_size()) * nD;                         // hc_attn, hc_ffn
    n += D * double(c.num_experts) + (double(c.num_experts_per_tok) + 1.0) * 3.0 * D * Fe;
  }
  return n + D * double(c.vocab_size) + double(c.hc_mult) * nD;  // head, hc_head
}

// DeepSeek-V4's attention per token, averaged over positions 0..T-1: q·k and
// p·v over the window and the compressed entries each query sees, plus the
// indexer's scores over every visible CSA entry.
double v4_attention_flops_per_token(const ModelConfig& c, int64_t T) {
  const double per_candidate = 2.0 * 2.0 * double(c.head_dim) * double(c.num_heads);
  const double per_index_entry = 2.0 * double(c.index_n_heads) * double(c.index_head_dim);
  double total = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t ratio = c.compress_ratio(l);
    for (int64_t p = 0; p < T; ++p) {
      const int64_t visible = ratio > 0 ? (p + 1) / ratio : 0;
      const int64_t entries = ratio == 4 ? std::min(visible, c.index_topk) : visible;
      total += per_candidate * double(std::min(p + 1, c.sliding_window) + entries);
      if (ratio == 4) total += per_index_entry * double(visible);
    }
  }
  return T > 0 ? total / double(T) : 0.0;
}

}  // namespace

double active_matmul_params(const ModelConfig& c) {
  if (c.is_v4()) return v4_active_matmul_params(c);
  const double D = double(c.hidden_size);
  double n = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    n += D * double((c.num_heads + 2 * c.num_kv_heads) * c.head_dim);  // wqkv
    n += double(c.q_dim()) * D;                                        // wo
    if (c.is_moe_layer(l)) {
      n += D * double(c.num_experts);                                                       // router
      n += double(c.num_experts_per_tok) * 3.0 * D * double(c.moe_intermediate_size);       // routed
      if (c.has_shared_expert()) n += 3.0 * D * double(c.shared_expert_intermediate_size);  // shared
      if (c.shared_expert_gate) n += D;
    } else {
      n += 3.0 * D * double(c.intermediate_size);
    }
  }
  n += D * double(c.vocab_size);  // lm_head
  return n;
}

double attention_flops_per_token(const ModelConfig& c, int64_t T) {
  if (c.is_v4()) return v4_attention_flops_per_token(c, T);
  return double(c.num_layers) * 2.0 * 2.0 * double(T) * double(c.head_dim) * double(c.num_heads);
}

double train_flops_per_token(const ModelConfig& c, int64_t T) {
  return 6.0 * active_matmul_params(c) + 3.0 * attention_flops_per_token(c, T);
}

double forward_flops_per_token(const ModelConfig& c, int64_t T) {
  return 2.0 * active_matmul_params(c) + attention_flops_per_token(c, T);
}

std::string model_name(const std::string& config_path) {
  return std::filesystem::path(config_path).stem().string();
}

std::string bench_config_path(const std::string& name) {
  if (const char* dir = std::getenv("LOCKSTEP_BENCH_CONFIGS")) return std::string(dir) + "/" + name + ".toml";
  return (std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "configs/bench" / (name + ".toml")).string();
}

Buffer bench_params(const ParamLayout& layout, const Context& ctx, uint64_t seed) {
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), seed, 0.02f, &ctx);
  return p;
}

std::string Table::str() const {
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

std::string fmt(const char* f, ...) {
  char buf[128];
  va_list args;
  va_start(args, f);
  std::vsnprintf(buf, sizeof buf, f, args);
  va_end(args);
  return buf;
}

namespace {
size_t status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return size_t(std::strtoull(line.c_str() + key.size(), nullptr, 10)) * 1024;
  return 0;
}
}  // namespace

size_t rss_bytes() { return status_kb("VmRSS"); }
size_t peak_rss_bytes() { return status_kb("VmHWM"); }

void reset_peak_rss() {
  // Hand the allocator's free pages back first: a benchmark run after another
  // in the same process (bench all) would otherwise reuse them without the
  // resident set growing, and measure a peak of nearly nothing.
  ::malloc_trim(0);
  std::ofstream out("/proc/self/clear_refs");
  if (out) out << "5";
}

}  // namespace lockstep::perf
