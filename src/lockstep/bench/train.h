// The training-throughput benchmark: tokens/s of full training steps
// (forward + backward over micro-batches, then clip + AdamW + weight repack)
// on sequences of a fixed length, with model FLOPs per token and the fraction
// of the machine's FMA peak (measured in the same process) it reaches.
// Shared by `lockstep bench train` and bench/train_bench.cpp.
#pragma once

#include "lockstep/tensor/dtype.h"

#include <cstdint>
#include <string>

#include "lockstep/bench/common.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::perf {

struct TrainBenchOptions {
  std::string config_path;  // a TOML file with a [model] section
  int threads = 2;
  int64_t seq_len = 256;  // tokens per sequence (all of them trained on)
  // 32 x 256 = 8192 tokens per optimizer step in two micro-batches of 4096:
  // an RL step has many micro-batches, and the optimizer's fixed cost (AdamW
  // over every parameter, repacking) is shared by the step's tokens.
  int64_t seqs_per_step = 32;  // sequences per optimizer step
  int64_t micro_batch_tokens = 4096;
  bool recompute = false;  // TrainerConfig::recompute_activations
  bool world_invariant = false;  // TrainerConfig::world_invariant (the exact gradient sum)
  DType precision = DType::F32;  // TrainerConfig::precision (the forward's weights)
  // TrainerConfig::in_place_weights, as SFT runs; false keeps the packed f32
  // copy that aligned RL's colocated rollout reads (--packed-copy).
  bool in_place = true;
  // TrainerConfig::lora: rank > 0 trains LoRA adapters of that rank on every
  // projection ("all-linear", alpha = 2 x rank) over the frozen base.
  int64_t lora_rank = 0;
  int64_t steps = 2;       // measured steps, after one warm-up step (0: memory only)
  const kernels::GpuBackend* gpu = nullptr;  // --device; null: the CPU kernels
};

struct TrainBenchResult {
  std::string model;
  TrainBenchOptions opt;
  double tokens_per_s = 0;
  double flops_per_token = 0;  // train_flops_per_token at seq_len
  double gflops = 0;           // achieved model GFLOP/s
  Peak peak;                   // measured FMA peak at opt.threads
  double cpu_s = 0;            // per step: CPU seconds of all threads
  double fwd_bwd_s = 0;        // per step: Trainer::accumulate
  double optim_s = 0;          // per step: Trainer::step (clip, AdamW, repack)
  double loss = 0;             // of the last step (a sanity check: ~log V at init)
  // Memory (bytes): the peak resident set of the run above the process's
  // resident set before the trainer existed, and what the trainer holds by
  // design; activations and workspace are the rest of the peak.
  int64_t params = 0;
  size_t peak_rss = 0;     // above the baseline
  size_t master = 0;       // the f32 parameters
  size_t packed = 0;       // the packed projections the forward reads (model::packed_bytes)
  size_t effective = 0;    // bf16/fp8: the widened quantized weights backward multiplies by
  size_t grads = 0, moments = 0;
  size_t exact_sum = 0;    // world_invariant: the fixed-point gradient sums
  size_t rest() const;     // peak_rss minus the above (activations, workspace, allocator slack)
};

// Runs the benchmark; a `peak` with wall_gflops <= 0 is measured here.
TrainBenchResult run_train_bench(const TrainBenchOptions& opt, Peak peak = {});

// "% of peak" compares model FLOPs per wall second with the peak (Peak::gflops);
// "per CPU-s" compares model FLOPs per CPU second (x threads) with it, which
// stays meaningful when other jobs share the cores but hides idle threads;
// "CPU use" is CPU seconds over (wall seconds x threads): below 100% means
// threads were idle (serial work) or preempted (other jobs).
Table train_table();

// One row of train_table() for `r`.
void add_row(Table& t, const TrainBenchResult& r);

// Peak memory per model: MB and bytes per parameter, by component.
Table train_memory_table();
void add_memory_row(Table& t, const TrainBenchResult& r);

}  // namespace lockstep::perf
