// GAE advantages and returns; formulas in gae.h and docs/rl.md.
#include "lockstep/rl/gae.h"

#include <cmath>

namespace lockstep::rl {

void gae_advantages(const float* values, int64_t n, double reward, double gamma, double lam, double* adv,
                    double* ret) {
  double next_value = 0, last = 0;
  for (int64_t t = n - 1; t >= 0; --t) {
    const double r = t == n - 1 ? reward : 0.0;
    const double v = values[t];
    const double delta = r + gamma * next_value - v;
    last = delta + gamma * lam * last;
    adv[t] = last;
    ret[t] = last + v;
    next_value = v;
  }
}

void whiten_token_advantages(std::vector<std::vector<double>>& adv) {
  double sum = 0;
  int64_t count = 0;
  for (const auto& a : adv)
    for (double x : a) {
      sum += x;
      ++count;
    }
  if (count == 0) return;
  const double mean = sum / double(count);
  double ss = 0;
  for (const auto& a : adv)
    for (double x : a) ss += (x - mean) * (x - mean);
  // verl's masked_var is unbiased (Bessel's correction); its masked_whiten
  // adds 1e-8 under the square root.
  const double scale = count > 1 ? 1.0 / std::sqrt(ss / double(count - 1) + 1e-8) : 1.0;
  for (auto& a : adv)
    for (double& x : a) x = (x - mean) * scale;
}

}  // namespace lockstep::rl
