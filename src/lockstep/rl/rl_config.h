// The RL run's configuration (RlConfig) and its reader from `lockstep rl`'s
// TOML: every section but [model] and [data], which the command reads.
#pragma once

#include <cstdint>
#include <string>

#include <toml++/toml.h>

#include "lockstep/eval/eval_config.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rl/algo.h"
#include "lockstep/rl/critic_config.h"
#include "lockstep/rl/env.h"
#include "lockstep/rl/partial_rollout.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {

// The [log] section.
struct LogConfig {
  int64_t report_interval = 0;    // write report.html every N steps (0: only at the end)
  int64_t samples_interval = 1;   // write samples/step_N.jsonl every N steps (0: never)
  int64_t samples_per_step = 16;  // samples written each time (the first groups of the step)
  bool progress = true;           // progress bars on a terminal
  // tensorboard, metric_names
  metrics::LoggerOptions metrics;
};

struct RlConfig {
  AlgoConfig algo;
  rollout::RolloutSection rollout;  // engine, sampling (n, temperature, ...), precisions ([model])
  EnvConfig env;                    // [rollout] env ...: multi-turn rollouts (docs/agents.md)
  PartialConfig partial;            // [rollout] partial ...: samples paused at a step's token budget
  int64_t batch_size = 16;          // prompts per step ([rollout] batch_size)
  train::TrainerConfig trainer;     // optimizer, micro_batch_tokens
  CriticSection critic;             // [critic]: PPO's value model ([algo] advantage = "gae")
  int64_t steps = 100;              // RL steps ([train] steps)
  uint64_t seed = 0;                // prompt order and sampling seeds ([train] seed)
  bool shuffle = true;
  int64_t save_interval = 0;        // checkpoint every N steps (0: only at the end)
  int keep_last = 2;
  int64_t log_interval = 1;         // console line every N steps
  eval::EvalSection eval;           // interval: eval every N steps (0: before and after only)
  reward::RewardOptions reward;
  LogConfig log;
  std::string out_dir = "runs/rl";
  int64_t threads = 0;
  // [dist] max_weight_staleness (the command that reads [dist] sets it). > 0:
  // the rollout generates the next step's first round while the trainer
  // trains on this one (one batch ahead, so values above 1 run as 1); needs a
  // backend that can_overlap(): rollout ranks, or in one process the
  // default OverlapRollout (rl/overlap_rollout.h).
  int64_t max_weight_staleness = 0;
  // [dist] rollout_threads: with max_weight_staleness > 0 in one process, the
  // thread count of the rollout engine's own pool (0: as many as the trainer's).
  int64_t rollout_threads = 0;
  // [rl] on_gap: what a token whose rollout and trainer logprobs differ at all
  // does when both engines run the same precision (aligned mode): abort stops
  // the step before the optimizer runs, naming the sample and the position;
  // warn logs it and trains on. Fast mode measures the gap and never aborts.
  enum class OnGap { Abort, Warn } on_gap = OnGap::Abort;
  // false: no checkpoint at all, not even the last (benchmarks; not a TOML key).
  bool checkpoints = true;
};

// Reads every section but [model] and [data] (which the caller reads), and
// [model]'s precision keys.
// Unknown keys and sections are errors naming the file.
RlConfig rl_config_from_toml(const toml::table& root, const std::string& source);

}  // namespace lockstep::rl
