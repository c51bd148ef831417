// Train/rollout mismatch metrics, named as RL users know them:
// train/train_rollout_logprob_abs_diff (mean |Δlogp| per sample, then over
// samples), its max, train/train_rollout_kl (k3 estimator), the fraction of
// tokens whose logprobs are bitwise equal, the router top-k disagreement
// rate per MoE layer and, for DeepSeek-V4, the indexer top-k disagreement.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/weights.h"

namespace lockstep::train {

struct MismatchStats {
  double abs_diff_mean = 0;       // mean over samples of the per-sample mean |Δ|
  double abs_diff_max = 0;        // largest |Δ| of any token
  double kl_k3 = 0;               // mean over tokens of exp(r) - 1 - r, r = logp_train - logp_rollout
  double bitwise_equal_frac = 0;  // tokens whose two logprobs have identical bits
  int64_t tokens = 0;
  int64_t samples = 0;
  std::vector<double> router_disagreement;  // per MoE layer; empty if not measured
  // DeepSeek-V4: fraction of (token, CSA layer) rows whose chosen compressed
  // entries differ; unset if not measured.
  std::optional<double> indexer_disagreement;

  // {"train/train_rollout_logprob_abs_diff": ..., ...} under `prefix` (default "train/").
  nlohmann::json to_json(const std::string& prefix = "train/") const;
};

// rollout[i] and train[i] are the logprobs of sample i's response tokens.
MismatchStats compute_mismatch(const std::vector<std::vector<float>>& rollout,
                               const std::vector<std::vector<float>>& train);

// Router disagreement per MoE layer between two routings of the same
// sequences, each (len, L_moe, K) per sequence, over positions [0, len-1)
// (the last token's routing is not computed by the rollout).
std::vector<double> router_disagreement(const std::vector<std::vector<int32_t>>& a,
                                        const std::vector<std::vector<int32_t>>& b, int64_t n_moe, int64_t k);

// Indexer disagreement between two records of DeepSeek-V4's indexer choices
// for the same sequences, each (len, L_csa, KI) per sequence: the fraction of
// (token, CSA layer) rows over positions [0, len-1) whose entry sets differ
// (the rollout never computes the last token's). 0 when there are no rows.
double indexer_disagreement(const std::vector<std::vector<int32_t>>& a,
                            const std::vector<std::vector<int32_t>>& b, int64_t n_csa, int64_t ki);

// The experts the trainer's forward (f32 master weights, every token new)
// picks for each sequence: (len, L_moe, K). With `replay`, the given routing
// is used instead (and returned as used).
std::vector<int32_t> trainer_routing(const Context& ctx, const model::ModelWeights& weights,
                                     const std::vector<int32_t>& tokens, const std::vector<int32_t>* replay);

// What the trainer's forward chooses for one sequence: its experts (len,
// L_moe, K) and DeepSeek-V4's indexer entries (len, L_csa, KI; empty for
// other models). A non-null replay is used instead of the forward's own
// choice (and returned as used).
struct TrainerChoices {
  std::vector<int32_t> experts;
  std::vector<int32_t> indexer;
};
TrainerChoices trainer_choices(const Context& ctx, const model::ModelWeights& weights,
                               const std::vector<int32_t>& tokens, const std::vector<int32_t>* replay_experts,
                               const std::vector<int32_t>* replay_indexer);

}  // namespace lockstep::train
