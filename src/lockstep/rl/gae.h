// Generalized advantage estimation (PPO with a learned critic, verl's
// algorithm.adv_estimator = "gae"): per-token advantages and returns of one
// response from the critic's values and the sample's reward on its last
// token, and their masked whitening over the batch. docs/rl.md, "PPO with a
// critic", gives the formulas.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::rl {

// One response of n tokens: values (n) the critic's value of each token (of
// the state before it), `reward` on token n - 1 and 0 elsewhere. Writes
//   delta_t = r_t + gamma * V_{t+1} - V_t        (V_n = 0)
//   A_t     = delta_t + gamma * lam * A_{t+1}    (A_n = 0)
//   R_t     = A_t + V_t                          (the critic's target)
// into adv (n) and ret (n), in double.
void gae_advantages(const float* values, int64_t n, double reward, double gamma, double lam, double* adv,
                    double* ret);

// verl's masked_whiten over every token of every sequence: (a - mean) /
// sqrt(var + 1e-8), var the unbiased variance of the batch's tokens. A batch
// of fewer than two tokens is only centred.
void whiten_token_advantages(std::vector<std::vector<double>>& adv);

}  // namespace lockstep::rl
