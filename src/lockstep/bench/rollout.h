// The rollout-engine benchmark: decode tokens/s at several batch
// sizes, prefill tokens/s, a GRPO-shaped workload (prompts x samples) with
// and without prefix sharing, and the roofline of a decode step: the larger
// of its compute bound (its model FLOPs at the measured FMA peak) and its
// memory bound (the bytes of weights and KV cache it must read, at the
// measured read bandwidth), a time no step can beat. Beside them, the time
// the same matrix products take alone at that batch size ("GEMM-only"), so
// the share of a step spent outside them (attention, norms, routing,
// sampling, scheduling) is visible. Shared by `lockstep bench rollout` and
// bench/rollout_bench.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/bench/common.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/weights.h"

namespace lockstep::perf {

struct RolloutBenchOptions {
  std::string config_path;
  int threads = 2;
  // Weight storage of the engine (F32, BF16, FP8E4M3). fp8 uses power-of-two
  // scales per fp8_block x fp8_block block (DeepSeek-V3's 128). bf16_kv: the
  // KV cache in bf16 as fast mode keeps it (aligned mode keeps it in f32 at
  // every precision, as the trainer does).
  DType precision = DType::F32;
  int64_t fp8_block = 128;
  bool bf16_kv = false;
  // The GPU backend the engine runs on (--device; null: the CPU kernels).
  const kernels::GpuBackend* gpu = nullptr;
  std::vector<int64_t> decode_batches = {1, 16, 64, 256};
  int64_t decode_prompt_len = 16;
  int64_t new_tokens = 32;  // generated per sample (decode and GRPO)
  int64_t prefill_prompts = 16;
  int64_t prefill_len = 256;
  int64_t grpo_prompts = 64;
  int64_t grpo_samples = 8;
  int64_t grpo_prompt_len = 64;
  double roofline_seconds = 0.3;  // time spent timing each roofline
};

// Engine-level numbers of one decode batch size.
struct DecodeResult {
  int64_t batch = 0;
  double tokens_per_s = 0;  // generated tokens / time of pure decode steps
  double step_ms = 0;       // mean pure decode step
  double gemm_step_ms = 0;  // the same step's GEMMs alone (measured; not a bound)
  // The step's model FLOPs (forward_flops_per_token x batch) at the FMA peak.
  double compute_step_ms = 0;
  // The bytes the step must read (decode_step_bytes) at the measured read bandwidth.
  double memory_step_ms = 0;
  double step_bytes = 0;
  // batch / the larger of compute_step_ms and memory_step_ms: the roofline a
  // step cannot beat (computing at the peak, or streaming its weights and KV cache).
  double roofline_tokens_per_s = 0;
  bool memory_bound() const { return memory_step_ms > compute_step_ms; }
  double gflops = 0;   // model GFLOP/s of the decode steps (forward_flops_per_token)
  double cpu_use = 0;  // CPU seconds / (wall seconds x threads) of the decode steps
};

struct RunResult {
  double seconds = 0;
  int64_t generated = 0;  // tokens sampled
  int64_t fed = 0;        // tokens run through the model (prompts not served by a cache, decodes)
  double tokens_per_s() const { return double(generated) / seconds; }
};

struct RolloutBenchResult {
  std::string model;
  RolloutBenchOptions opt;
  Peak peak;
  double copy_gb_per_s = 0;  // measure_read_bandwidth over the model's packed weight bytes
  std::vector<DecodeResult> decode;
  double prefill_tokens_per_s = 0, prefill_gflops = 0;
  RunResult grpo_shared, grpo_unshared;
};

// Bytes a decode step of `batch` sequences with a context of ctx_len tokens
// must read at least once: every packed weight the step multiplies by (the
// routed experts as the expected number of distinct experts `batch` tokens
// pick under uniform routing, E * (1 - (1 - K/E)^batch) per MoE layer, each
// expert's packed bytes) and the batch's keys and values (kv_bytes per value).
double decode_step_bytes(const model::ModelWeights& w, int64_t batch, int64_t ctx_len, int64_t kv_bytes);

// Decode throughput at one batch size: `batch` requests of decode_prompt_len
// random tokens, each generating new_tokens tokens. copy_gb_per_s: the
// bandwidth the memory bound uses (0: no memory bound).
// copy_gb_per_s and peak_gflops: the measured read bandwidth and FMA peak
// the bounds use (0: that bound is left out).
DecodeResult run_decode(const Context& ctx, const model::ModelWeights& w, const RolloutBenchOptions& opt,
                        int64_t batch, double copy_gb_per_s = 0, double peak_gflops = 0);

// Prefill throughput (prompt tokens/s): prompts of prefill_len tokens, one new token each.
double run_prefill(const Context& ctx, const model::ModelWeights& w, const RolloutBenchOptions& opt);

// GRPO-shaped: grpo_prompts prompts, grpo_samples samples each. Shared: one
// request per prompt with n samples (the samples share the prompt's KV blocks)
// and the prefix cache on. Unshared: one request per sample, prefix cache off,
// so every sample prefills its own copy of the prompt.
RunResult run_grpo(const Context& ctx, const model::ModelWeights& w, const RolloutBenchOptions& opt,
                   bool shared);

// All of the above on the model of opt.config_path; a `peak` with
// wall_gflops <= 0 is measured here.
RolloutBenchResult run_rollout_bench(const RolloutBenchOptions& opt, Peak peak = {});

// "f32", "bf16", "fp8" (the --precision names).
std::string precision_name(DType p);

// Two tables: decode by batch size (with its two bounds), then prefill and GRPO.
std::string rollout_tables(const std::vector<RolloutBenchResult>& rs);

}  // namespace lockstep::perf
