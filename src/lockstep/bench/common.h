// Shared by `lockstep bench` (cmd_bench.cpp) and the Google Benchmark targets
// bench/train_bench.cpp and bench/rollout_bench.cpp, so both print the same
// tables: the machine's measured fp32 FMA peak, model FLOPs per token counted
// from the architecture, benchmark model loading and a plain-text table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/model/config.h"
#include "lockstep/model/params.h"

namespace lockstep::perf {

// Seconds of CPU time used by this process (all threads) so far.
double process_cpu_seconds();
// Seconds of CPU time used by the calling thread so far.
double thread_cpu_seconds();

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
  int vector_width = 8;  // floats per FMA of the chains measured: 16 where the f32 GEMM runs on AVX-512
  double gflops() const { return std::max(wall_gflops, cpu_gflops); }
};

// Threads each running register-resident FMA chains, started together; best
// of `trials` trials of about `seconds` each. The chains are 8 floats wide,
// and also 16 where the f32 GEMM runs on AVX-512 (the larger peak is kept). Best-of rather than mean: on a
// shared machine the quietest trial is the closest to what the hardware can do.
Peak measure_fma_peak(int threads, double seconds = 0.1, int trials = 5);

// Parameters a token passes through in matrix products: attention
// projections, router, its K routed experts (+ shared experts or the dense
// FFN) in every layer, and lm_head. The embedding lookup is not a product.
double active_matmul_params(const ModelConfig& c);

// Attention score and value products per token of a forward, for sequences
// of length T: q·kᵀ and p·v are each 2·T·Dh FLOPs per head. Counted over the
// full T (the convention of PaLM's model-FLOPs utilisation), although the
// causal mask means the kernels do about half of it.
double attention_flops_per_token(const ModelConfig& c, int64_t T);

// Training FLOPs per token (forward + backward): 6 per active matmul
// parameter (2 forward, 4 backward: dX and dW) plus attention × 3 (the
// backward of each attention product costs two products).
double train_flops_per_token(const ModelConfig& c, int64_t T);

// Forward-only FLOPs per token at context length T (decode, prefill).
double forward_flops_per_token(const ModelConfig& c, int64_t T);

// Read bandwidth with the context's threads: GB/s of one pass reading a
// buffer of `bytes` (each thread its own contiguous part, 64-bit loads), the
// best of `trials` passes. Over a buffer the size of a model's weights it is
// the rate steps that cycle through those weights read them at: the last-level
// cache's when they fit in it, the memory's when they do not.
double measure_read_bandwidth(const Context& ctx, size_t bytes, int trials = 5);

// "configs/bench/moe-tiny.toml" -> "moe-tiny".
std::string model_name(const std::string& config_path);

// The benchmark configs of this source tree, found from the source file's
// path (benchmarks run from any directory); LOCKSTEP_BENCH_CONFIGS overrides.
std::string bench_config_path(const std::string& name);

// Random f32 parameters for a benchmark model: the values do not change the
// cost, only the routing, and a fixed seed keeps the routing the same run to run.
Buffer bench_params(const ParamLayout& layout, const Context& ctx, uint64_t seed = 1);

// Resident memory from /proc/self/status: the current (VmRSS) and the peak
// since the last reset_peak_rss (VmHWM), in bytes; 0 where unreadable.
size_t rss_bytes();
size_t peak_rss_bytes();
// Starts a new peak (Linux: "5" into /proc/self/clear_refs); a no-op where refused.
void reset_peak_rss();

// A fixed-width text table: columns right-aligned to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  size_t columns() const { return rows_.front().size(); }
  std::string str() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// printf-style formatting of one cell (at most 127 characters).
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

}  // namespace lockstep::perf
