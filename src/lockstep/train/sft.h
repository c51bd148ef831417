// Supervised fine-tuning loop: token cross-entropy over response tokens,
// batches of `batch_size` sequences per optimizer step drawn in a seeded,
// resumable order, metrics.jsonl, periodic checkpoints and --resume.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {

struct SftConfig {
  int64_t steps = 100;
  int64_t batch_size = 8;      // sequences per optimizer step
  uint64_t seed = 0;           // data order
  bool shuffle = true;
  int64_t save_interval = 0;   // 0: only at the end
  int keep_last = 2;           // checkpoints kept
  int64_t log_interval = 1;    // console line every N steps
  metrics::LoggerOptions log;  // [log] tensorboard
};

struct SftStepStats {
  int64_t step = 0;
  double loss = 0;       // mean token cross-entropy of the step's batch
  double grad_norm = 0;
  double lr = 0;
  int64_t tokens = 0;    // tokens forwarded (prompt + response)
  double tokens_per_s = 0;
  bool skipped = false;  // non-finite loss or gradient: update skipped
};

// The sequence indices of step `step` (1-based): epochs of a Philox
// permutation of [0, n) keyed by (seed, epoch). Pure function: resuming
// continues with the same order.
std::vector<size_t> sft_batch_indices(size_t n, int64_t batch_size, int64_t step, uint64_t seed, bool shuffle);

// The SFT loss for one step over `batch`: mean over all response tokens.
SftStepStats sft_step(Trainer& trainer, const std::vector<TrainSequence>& batch);

// How run_sft runs on several trainer ranks (parallel::dp_sft_step): every rank
// passes the same data and calls run_sft; `step` trains one global batch.
struct SftRanks {
  std::function<SftStepStats(Trainer&, const std::vector<TrainSequence>& batch)> step;  // empty: sft_step
  bool writer = true;  // only the writer writes metrics, console lines and checkpoints
};

// Runs steps [start_step + 1, cfg.steps], writing run_dir/metrics.jsonl and
// checkpoints. resume: continue from run_dir's latest intact checkpoint if
// any, or from `resume_from` ("step_N", "N" or a directory) when it is set
// (find_resume_checkpoint). on_step (may be empty) sees every step's stats.
void run_sft(Trainer& trainer, const std::vector<TrainSequence>& data, const std::string& run_dir,
             const SftConfig& cfg, bool resume, const std::string& tokenizer_dir,
             const std::function<void(const SftStepStats&)>& on_step = {}, const SftRanks& ranks = {},
             const std::string& resume_from = "");

}  // namespace lockstep::train
