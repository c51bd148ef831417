// The RL loop of docs/architecture.md section 3: prompts -> rollout (n samples each) ->
// rewards -> filters -> advantages -> trainer update(s) -> weight sync ->
// metrics, samples, eval, checkpoint, report. `lockstep rl` and `lockstep
// demo` both run it; the rollout backend decides where samples come from
// (this process or rollout ranks, which may run one step ahead).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "lockstep/data/dataset.h"
#include "lockstep/eval/eval_config.h"
#include "lockstep/eval/evaluator.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rl/algo.h"
#include "lockstep/rl/rollout_backend.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/tokenizer/tokenizer.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {

// The [log] section.
struct LogConfig {
  int64_t report_interval = 0;    // write report.html every N steps (0: only at the end)
  int64_t samples_interval = 1;   // write samples/step_N.jsonl every N steps (0: never)
  int64_t samples_per_step = 16;  // samples written each time (the first groups of the step)
  bool progress = true;           // progress bars on a terminal
};

struct RlConfig {
  AlgoConfig algo;
  rollout::RolloutSection rollout;  // engine, sampling (n, temperature, ...), precision
  int64_t batch_size = 16;          // prompts per step ([rollout] batch_size)
  train::TrainerConfig trainer;     // optimizer, micro_batch_tokens
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
  // backend that can_overlap() (rollout ranks).
  int64_t max_weight_staleness = 0;
};

// Reads every section but [model] and [data] (which the caller reads).
// Unknown keys and sections are errors naming the file.
RlConfig rl_config_from_toml(const toml::table& root, const std::string& source);

// Data parallelism over trainer ranks (parallel/ fills it in; the defaults are
// one rank). Every trainer rank runs the loop on the same samples and trains
// on its shard of each mini-batch; the trainer's grad_reduce sums gradients.
struct TrainerGroup {
  // This rank's share [begin, end) of a mini-batch of n sequences.
  std::function<std::pair<size_t, size_t>(size_t n)> shard;
  // Sums the values element-wise over the trainer ranks, in place.
  std::function<void(std::vector<double>&)> sum;
  // The largest of the values over the trainer ranks.
  std::function<double(double)> max;
  // Only the writer writes metrics, samples, eval files, checkpoints, reports.
  bool writer = true;
};

struct RlInputs {
  const tokenizer::Tokenizer* tok = nullptr;
  std::vector<data::PromptExample> train;  // prompts with labels
  std::vector<data::PromptExample> eval;   // held-out problems (may be empty)
  std::string tokenizer_dir;               // tokenizer files copied into checkpoints
  // The frozen reference for the KL term (layout of the trainer's model);
  // required when algo.kl_coef > 0.
  const float* ref_params = nullptr;
  std::shared_ptr<const reward::Reward> reward;  // null: make_reward(cfg.reward)
  std::shared_ptr<RolloutBackend> rollout;       // null: LocalRollout (this process)
  TrainerGroup group;
  // Sees every step's metrics (after they are written).
  std::function<void(int64_t step, const nlohmann::json& metrics)> on_step;
  // Called at the end of a step that wrote metrics (reports, tests).
  std::function<void(int64_t step)> after_step;
};

struct RlResult {
  std::optional<eval::EvalSummary> first_eval, last_eval;  // first/last of this run
  int64_t first_eval_step = -1, last_eval_step = -1;
  double max_logprob_abs_diff = 0;   // largest train_rollout_logprob_abs_diff of any step
  double max_logprob_abs_diff_max = 0;  // largest single-token |Δ| of any step
  int64_t steps_run = 0;
  double seconds = 0;
  // Mean seconds per step of each phase (rollout, reward, old_logprob,
  // ref_logprob, train, weight_sync, eval, checkpoint).
  std::vector<std::pair<std::string, double>> phase_seconds;
};

// Runs steps [start + 1, cfg.steps] where start is 0, or the step of the
// latest checkpoint in cfg.out_dir when `resume`.
RlResult run_rl(train::Trainer& trainer, const RlInputs& in, const RlConfig& cfg, bool resume);

// Prompt order: position c of the stream is prompt order_index(c): epochs of
// a Philox permutation keyed by (seed, epoch), as SFT's data order.
class PromptStream {
 public:
  PromptStream(size_t n, uint64_t seed, bool shuffle);
  size_t at(uint64_t position);
 private:
  size_t n_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = -1;
  std::vector<size_t> perm_;
};

}  // namespace lockstep::rl
