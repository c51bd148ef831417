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

#include "lockstep/data/dataset.h"
#include "lockstep/eval/evaluator.h"
#include "lockstep/reward/reward.h"
#include "lockstep/rl/algo.h"
#include "lockstep/rl/rl_config.h"
#include "lockstep/rl/rollout_backend.h"
#include "lockstep/rl/trainer_group.h"
#include "lockstep/tokenizer/tokenizer.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {

struct RlInputs {
  const tokenizer::Tokenizer* tok = nullptr;
  std::vector<data::PromptExample> train;  // prompts with labels
  std::vector<data::PromptExample> eval;   // held-out problems (may be empty)
  std::string tokenizer_dir;               // tokenizer files copied into checkpoints
  // With resume: the checkpoint to continue from ("step_N", "N" or a
  // directory; train::find_resume_checkpoint); empty: the latest intact one.
  std::string resume_from;
  // The frozen reference for the KL term (the trainer's model config);
  // required when algo.kl_coef > 0.
  std::shared_ptr<train::Scorer> reference;
  std::shared_ptr<const reward::Reward> reward;  // null: make_reward(cfg.reward)
  std::shared_ptr<RolloutBackend> rollout;       // null: LocalRollout (this process)
  // Data parallelism over trainer ranks (rl/dist_group.h for an MPI job).
  std::shared_ptr<TrainerGroup> group = std::make_shared<OneRank>();
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

// Runs steps [start + 1, cfg.steps] where start is 0, or when `resume` the
// step of the checkpoint in cfg.out_dir it resumes from (the latest intact
// one, or in.resume_from).
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
