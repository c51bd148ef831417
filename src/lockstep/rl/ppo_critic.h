// PPO's critic in the RL loop ([algo] advantage = "gae"): before the policy's
// update it scores the batch's values (the old values), from which GAE gives
// each response token's advantage and return; after it, the critic trains on
// those returns with verl's clipped value loss, one optimizer step per
// mini-batch. Its checkpoint is a critic/ folder inside the policy's.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/rl/algo.h"
#include "lockstep/rl/critic_config.h"
#include "lockstep/train/critic.h"

namespace lockstep::rl {

class PpoCritic {
 public:
  // The critic starts from cfg.path, or (empty) from a copy of the policy's
  // parameters `policy` (ParamLayout(policy_config) floats).
  PpoCritic(const Context& ctx, const ModelConfig& policy_config, const float* policy,
            const CriticSection& cfg, const AlgoConfig& algo);

  // The batch's old values and, from rewards (one per sequence, on its last
  // response token), the GAE returns and the whitened advantages (adv: one
  // vector of response tokens per sequence).
  void advantages(const std::vector<train::TrainSequence>& seqs, const std::vector<double>& rewards,
                  std::vector<std::vector<double>>& adv);
  // num_minibatches optimizer steps over contiguous slices of the batch (the
  // policy's cut), each minimising the token-mean clipped value loss.
  // Returns the critic/ metrics and perf/critic_time_s (the step's time in
  // the critic: its values, GAE and this update).
  nlohmann::json update(const std::vector<train::TrainSequence>& seqs, int64_t num_minibatches);

  void save(const std::string& checkpoint_dir);  // into checkpoint_dir/critic
  void load(const std::string& checkpoint_dir);  // from checkpoint_dir/critic
  train::Critic& critic() { return *critic_; }

 private:
  AlgoConfig algo_;
  std::unique_ptr<train::Critic> critic_;
  std::vector<std::vector<float>> old_values_;  // of the batch advantages() saw
  std::vector<std::vector<double>> returns_;
  double seconds_ = 0;  // in advantages() and update() this step: perf/critic_time_s
};

}  // namespace lockstep::rl
