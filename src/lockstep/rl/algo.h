// The math of one RL update, as pure functions over plain arrays: reward
// shaping (DAPO's overlong penalty), group advantages (GRPO, Dr.GRPO, RLOO,
// REINFORCE++ with baseline), importance correction between the rollout and
// the trainer (TIS / MIS at token, sequence or geometric level), and the
// per-token policy loss (PPO-clip with clip-higher and dual-clip, GSPO,
// CISPO) with KL to a reference and an entropy bonus, aggregated as
// token-mean, seq-mean-token-mean, seq-mean-token-sum or
// seq-mean-token-sum-norm. docs/rl.md gives every formula.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/base/toml_section.h"

namespace lockstep::rl {

enum class Advantage { Grpo, DrGrpo, Rloo, ReinforcePP, Gae };
enum class PolicyLoss { Ppo, Gspo, Cispo };
enum class LossAgg { TokenMean, SeqMeanTokenMean, SeqMeanTokenSum, SeqMeanTokenSumNorm };
enum class KlType { K1, K2, K3 };
enum class IsLevel { None, Token, Sequence, Geometric };
enum class IsMode { Truncate, Mask };

// The [algo] section.
struct AlgoConfig {
  Advantage advantage = Advantage::Grpo;
  double adv_eps = 1e-6;  // GRPO: (r - mean) / (std + adv_eps)
  // GAE (advantage = "gae", PPO with a learned critic: rl/gae.h): discount
  // and the GAE lambda, verl's algorithm.gamma and algorithm.lam.
  double gamma = 1.0;
  double lam = 1.0;
  PolicyLoss policy_loss = PolicyLoss::Ppo;
  double eps_clip = 0.2;       // ratio clipped to [1 - eps_clip, 1 + eps_clip_high]
  double eps_clip_high = 0.2;  // clip-higher (DAPO uses 0.28)
  double eps_clip_c = 0.0;     // dual-clip bound c > 1 for negative advantages (0: off)
  LossAgg loss_agg = LossAgg::TokenMean;
  int64_t loss_agg_norm_len = 0;  // seq-mean-token-sum-norm divisor (0: max_new_tokens)
  double kl_coef = 0.0;           // KL to the frozen reference (0: no reference kept)
  KlType kl_type = KlType::K3;
  double entropy_coef = 0.0;
  // Importance correction between the rollout's and the trainer's old logprobs.
  IsLevel rollout_is = IsLevel::None;
  IsMode rollout_is_mode = IsMode::Truncate;  // truncate = TIS, mask = MIS
  double rollout_is_threshold = 2.0;          // upper bound of the weight
  double rollout_is_threshold_lower = 0.0;    // mask mode lower bound (0: 1 / threshold)
  int64_t num_steps_per_rollout = 1;          // optimizer steps per rollout batch
  bool dynamic_sampling = false;              // drop groups whose rewards all agree
  int64_t max_sampling_tries = 4;             // rollout rounds per step with dynamic sampling
  int64_t overlong_buffer_len = 0;            // DAPO soft overlong penalty (0: off)
  double overlong_penalty_factor = 1.0;
  bool routing_replay = false;  // R3: the trainer uses the rollout's experts
  // Recompute old-policy logprobs with the trainer even when the on-policy
  // shortcut applies (aligned mode, same weight version).
  bool recompute_logprobs = false;

  void validate() const;  // throws Error naming the bad key
};

AlgoConfig algo_config_from_toml(TomlSection& s);
std::string to_string(Advantage a);
std::string to_string(PolicyLoss p);
std::string to_string(LossAgg a);

// DAPO's soft overlong penalty: 0 up to max_len - buffer, then falling
// linearly to -factor at max_len (and below for longer responses: capped at
// -factor).
double overlong_penalty(int64_t response_len, int64_t max_len, int64_t buffer, double factor);

// Advantages of one group of samples of the same prompt (GRPO, Dr.GRPO, RLOO);
// REINFORCE++ gives r - group mean here and is whitened over the batch by
// whiten_advantages. A group of one sample gets 0 (no baseline). GAE's
// advantages are per token (rl/gae.h): 0 here.
std::vector<double> group_advantages(const std::vector<double>& rewards, Advantage kind, double eps);

// REINFORCE++: (a - mean) / (std + eps) over all response tokens of the batch
// (sample i weighs tokens[i]); the std is the population std of the tokens.
void whiten_advantages(std::vector<double>& adv, const std::vector<int64_t>& tokens, double eps);

// Importance weights of one sequence between trainer (old_logp) and rollout
// (rollout_logp): per token for Token level, one weight repeated for
// Sequence (exp of the summed log-ratio) and Geometric (exp of its mean).
// Truncate: min(w, threshold); Mask: w outside [lower, threshold] becomes 0.
// *corrected counts tokens whose weight was truncated or masked.
// A non-null mask (n entries) leaves its 0 tokens out: weight 1, not in the
// sequence-level sums, not counted in *corrected.
std::vector<double> importance_weights(const float* old_logp, const float* rollout_logp, int64_t n,
                                       const AlgoConfig& cfg, int64_t* corrected, const uint8_t* mask = nullptr);

// Per-token loss weight of a sequence of n tokens under the aggregation.
// total_tokens and num_seqs describe the whole optimizer step's batch.
double token_weight(LossAgg agg, int64_t n, int64_t total_tokens, int64_t num_seqs, int64_t norm_len);

// Inputs and outputs of the loss of one sequence.
struct SeqLossInput {
  const float* logp = nullptr;          // current policy (trainer forward)
  const float* entropy = nullptr;       // may be null when entropy_coef == 0
  const float* old_logp = nullptr;      // policy that sampled (trainer's view of it)
  const float* ref_logp = nullptr;      // reference; null when kl_coef == 0
  const double* is_weight = nullptr;    // importance weights; null = 1
  // (n) 0: the token is not the model's (a multi-turn sample's environment
  // tokens): no loss term, zero gradient, not in the stats. Null: all train.
  const uint8_t* mask = nullptr;
  int64_t n = 0;
  double advantage = 0;
  // (n) per-token advantages (GAE); null: `advantage` for every token.
  const double* token_advantage = nullptr;
  double token_weight = 0;  // from token_weight()
};

struct SeqLossStats {
  double pg_loss = 0;      // sum over tokens of token_weight * pg term
  double kl = 0;           // sum of token_weight * kl term (before kl_coef)
  double entropy = 0;      // sum of token_weight * entropy
  int64_t clipped = 0;     // tokens whose ratio term was clipped (or dual-clipped)
  double ratio_sum = 0;    // sum of ratios (for the mean)
  double approx_kl = 0;    // sum of (old_logp - logp) over tokens: the ppo_kl metric
};

// Writes dloss/dlogp (and dloss/dentropy when entropy and dentropy are
// given) and returns the loss of the sequence:
//   sum_t w_t [ is_t * pg_t + kl_coef * kl_t - entropy_coef * H_t ].
double sequence_loss(const AlgoConfig& cfg, const SeqLossInput& in, float* dlogp, float* dentropy,
                     SeqLossStats* stats);

}  // namespace lockstep::rl
