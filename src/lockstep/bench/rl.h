// The RL-step benchmark: the RL loop of `lockstep rl` (rl::run_rl, one
// process) on a bench model with random weights, a byte-level tokenizer,
// random prompts and a synthetic reward, timed per phase, with the step's peak
// resident memory split into what the trainer and the rollout hold by design.
// `lockstep bench rl` prints its tables.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/bench/common.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::perf {

struct RlBenchOptions {
  std::string config_path;  // a TOML file with a [model] section
  int threads = 2;
  int64_t prompts = 8;      // [rollout] batch_size
  int64_t samples = 8;      // [rollout] n
  int64_t prompt_len = 64;  // tokens per prompt (random bytes)
  int64_t new_tokens = 64;  // [rollout] max_new_tokens, always all of them (ignore_eos)
  int64_t micro_batch_tokens = 4096;
  int64_t steps = 2;                     // measured steps, after one warm-up step (0: memory only)
  bool recompute = false;                // [train] recompute_activations
  DType precision = DType::F32;          // [model] precision (the rollout's)
  DType trainer_precision = DType::F32;  // [model] trainer_precision (differs: fast mode)
  int64_t staleness = 0;                 // [dist] max_weight_staleness (1: generate one step ahead)
  int64_t rollout_threads = 0;           // [dist] rollout_threads (staleness 1)
  double kl_coef = 0;                    // [algo] kl_coef (> 0: a frozen reference model)
  // [lora] rank (> 0: LoRA adapters on every projection, alpha = 2 x rank,
  // as bench train --lora-rank; 0: full fine-tuning).
  int64_t lora_rank = 0;
};

struct RlBenchResult {
  std::string model;
  RlBenchOptions opt;
  // Per measured step (means): seconds of the step and of its phases.
  double step_s = 0, rollout_s = 0, old_logprob_s = 0, ref_logprob_s = 0, train_s = 0, sync_s = 0, wait_s = 0;
  double generated_tokens = 0;  // per step
  double trained_tokens = 0;    // per step: prompt + response of every sample
  // Memory (bytes): the peak resident set of the run above the process's
  // resident set before the trainer existed, and what is held by design.
  int64_t params = 0;
  size_t peak_rss = 0;
  size_t master = 0, packed = 0, effective = 0, grads = 0, moments = 0;  // the trainer's, as in bench train
  size_t adapters = 0;   // LoRA: the adapters' f32 values (in master; grads and moments are theirs only)
  size_t reference = 0;  // kl_coef > 0: the reference's f32 parameters and packed weights
  size_t rollout_master = 0, rollout_packed = 0;  // the rollout's own copies (unpacked, packed)
  size_t kv_cache = 0;                            // the rollout engine's KV cache (allocated)
  size_t rest() const;  // peak_rss minus the above (activations, workspace, logits, allocator slack)
};

// Runs the benchmark in a temporary run directory (removed afterwards; no
// checkpoints are written).
RlBenchResult run_rl_bench(const RlBenchOptions& opt);

Table rl_table();
void add_row(Table& t, const RlBenchResult& r);
Table rl_memory_table();
void add_memory_row(Table& t, const RlBenchResult& r);

}  // namespace lockstep::perf
