// RL update math; formulas in docs/rl.md.
#include "lockstep/rl/algo.h"

#include <algorithm>
#include <cmath>

#include "lockstep/base/error.h"

namespace lockstep::rl {

void AlgoConfig::validate() const {
  LS_CHECK(eps_clip >= 0 && eps_clip < 1) << "[algo] eps_clip must be in [0, 1), got " << eps_clip;
  LS_CHECK(eps_clip_high >= 0) << "[algo] eps_clip_high must be >= 0, got " << eps_clip_high;
  LS_CHECK(eps_clip_c == 0 || eps_clip_c > 1) << "[algo] eps_clip_c must be 0 (off) or > 1, got " << eps_clip_c;
  LS_CHECK(kl_coef >= 0) << "[algo] kl_coef must be >= 0, got " << kl_coef;
  LS_CHECK(rollout_is_threshold > 0) << "[algo] rollout_is_threshold must be > 0";
  LS_CHECK(rollout_is_threshold_lower >= 0 && rollout_is_threshold_lower < rollout_is_threshold)
      << "[algo] rollout_is_threshold_lower must be in [0, rollout_is_threshold)";
  LS_CHECK(num_steps_per_rollout >= 1) << "[algo] num_steps_per_rollout must be >= 1";
  LS_CHECK(max_sampling_tries >= 1) << "[algo] max_sampling_tries must be >= 1";
  LS_CHECK(overlong_buffer_len >= 0) << "[algo] overlong_buffer_len must be >= 0";
  LS_CHECK(adv_eps > 0) << "[algo] adv_eps must be > 0";
  LS_CHECK(gamma >= 0 && gamma <= 1) << "[algo] gamma must be in [0, 1], got " << gamma;
  LS_CHECK(lam >= 0 && lam <= 1) << "[algo] lam must be in [0, 1], got " << lam;
}

namespace {

template <typename E>
E pick(TomlSection& s, const std::string& key, E fallback, const std::vector<std::pair<std::string, E>>& names) {
  std::vector<std::string> choices;
  std::string fb;
  for (const auto& [n, e] : names) {
    choices.push_back(n);
    if (e == fallback && fb.empty()) fb = n;
  }
  const std::string v = s.get_enum(key, fb, choices);
  for (const auto& [n, e] : names)
    if (n == v) return e;
  return fallback;
}

const std::vector<std::pair<std::string, Advantage>> kAdvantages = {{"grpo", Advantage::Grpo},
                                                                    {"drgrpo", Advantage::DrGrpo},
                                                                    {"rloo", Advantage::Rloo},
                                                                    {"reinforce++", Advantage::ReinforcePP},
                                                                    {"gae", Advantage::Gae}};
const std::vector<std::pair<std::string, PolicyLoss>> kPolicyLosses = {
    {"ppo", PolicyLoss::Ppo}, {"gspo", PolicyLoss::Gspo}, {"cispo", PolicyLoss::Cispo}};
const std::vector<std::pair<std::string, LossAgg>> kLossAggs = {
    {"token-mean", LossAgg::TokenMean},
    {"seq-mean-token-mean", LossAgg::SeqMeanTokenMean},
    {"seq-mean-token-sum", LossAgg::SeqMeanTokenSum},
    {"seq-mean-token-sum-norm", LossAgg::SeqMeanTokenSumNorm}};

template <typename E>
std::string name_of(E e, const std::vector<std::pair<std::string, E>>& names) {
  for (const auto& [n, v] : names)
    if (v == e) return n;
  return "?";
}

// exp with the exponent clamped, so a wild log-ratio gives a large finite
// weight instead of inf (which would poison the gradient).
double safe_exp(double x) { return std::exp(std::clamp(x, -80.0, 80.0)); }

}  // namespace

std::string to_string(Advantage a) { return name_of(a, kAdvantages); }
std::string to_string(PolicyLoss p) { return name_of(p, kPolicyLosses); }
std::string to_string(LossAgg a) { return name_of(a, kLossAggs); }

AlgoConfig algo_config_from_toml(TomlSection& s) {
  AlgoConfig c;
  c.advantage = pick(s, "advantage", c.advantage, kAdvantages);
  c.adv_eps = s.get_double("adv_eps", c.adv_eps, 1e-12, 1.0);
  c.gamma = s.get_double("gamma", c.gamma, 0.0, 1.0);
  c.lam = s.get_double("lam", c.lam, 0.0, 1.0);
  c.policy_loss = pick(s, "policy_loss", c.policy_loss, kPolicyLosses);
  c.eps_clip = s.get_double("eps_clip", c.eps_clip, 0.0, 0.999);
  c.eps_clip_high = s.get_double("eps_clip_high", c.eps_clip, 0.0, 100.0);
  c.eps_clip_c = s.get_double("eps_clip_c", c.eps_clip_c, 0.0, 1e9);
  c.loss_agg = pick(s, "loss_agg", c.loss_agg, kLossAggs);
  c.loss_agg_norm_len = s.get_int("loss_agg_norm_len", c.loss_agg_norm_len, 0);
  c.kl_coef = s.get_double("kl_coef", c.kl_coef, 0.0);
  c.kl_type = pick(s, "kl_type", c.kl_type, {{"k1", KlType::K1}, {"k2", KlType::K2}, {"k3", KlType::K3}});
  c.entropy_coef = s.get_double("entropy_coef", c.entropy_coef);
  c.rollout_is = pick(s, "rollout_is", c.rollout_is,
                      {{"none", IsLevel::None}, {"token", IsLevel::Token}, {"sequence", IsLevel::Sequence},
                       {"geometric", IsLevel::Geometric}});
  c.rollout_is_mode = pick(s, "rollout_is_mode", c.rollout_is_mode,
                           {{"truncate", IsMode::Truncate}, {"mask", IsMode::Mask}});
  c.rollout_is_threshold = s.get_double("rollout_is_threshold", c.rollout_is_threshold, 1e-9);
  c.rollout_is_threshold_lower = s.get_double("rollout_is_threshold_lower", c.rollout_is_threshold_lower, 0.0);
  c.num_steps_per_rollout = s.get_int("num_steps_per_rollout", c.num_steps_per_rollout, 1, 1024);
  c.dynamic_sampling = s.get_bool("dynamic_sampling", c.dynamic_sampling);
  c.max_sampling_tries = s.get_int("max_sampling_tries", c.max_sampling_tries, 1, 1000);
  c.overlong_buffer_len = s.get_int("overlong_buffer_len", c.overlong_buffer_len, 0);
  c.overlong_penalty_factor = s.get_double("overlong_penalty_factor", c.overlong_penalty_factor, 0.0);
  c.routing_replay = s.get_bool("routing_replay", c.routing_replay);
  c.recompute_logprobs = s.get_bool("recompute_logprobs", c.recompute_logprobs);
  try {
    c.validate();
  } catch (const Error& e) {
    LS_THROW << s.source() << ": " << e.what();
  }
  return c;
}

double overlong_penalty(int64_t response_len, int64_t max_len, int64_t buffer, double factor) {
  if (buffer <= 0) return 0.0;
  const int64_t expected = max_len - buffer;
  if (response_len <= expected) return 0.0;
  const double exceed = double(response_len - expected);
  return -std::min(exceed / double(buffer), 1.0) * factor;
}

std::vector<double> group_advantages(const std::vector<double>& rewards, Advantage kind, double eps) {
  const size_t n = rewards.size();
  std::vector<double> adv(n, 0.0);
  if (n < 2) return adv;
  double mean = 0;
  for (double r : rewards) mean += r;
  mean /= double(n);
  switch (kind) {
    case Advantage::Grpo: {
      double ss = 0;
      for (double r : rewards) ss += (r - mean) * (r - mean);
      const double std = std::sqrt(ss / double(n - 1));  // unbiased, as torch.std
      for (size_t i = 0; i < n; ++i) adv[i] = (rewards[i] - mean) / (std + eps);
      break;
    }
    case Advantage::DrGrpo:
    case Advantage::ReinforcePP:
      for (size_t i = 0; i < n; ++i) adv[i] = rewards[i] - mean;
      break;
    case Advantage::Rloo:  // r_i - mean of the others = n/(n-1) (r_i - mean)
      for (size_t i = 0; i < n; ++i) adv[i] = double(n) / double(n - 1) * (rewards[i] - mean);
      break;
    case Advantage::Gae:  // per token, from the critic's values (rl/gae.h)
      break;
  }
  return adv;
}

void whiten_advantages(std::vector<double>& adv, const std::vector<int64_t>& tokens, double eps) {
  LS_CHECK(adv.size() == tokens.size()) << "whiten_advantages: size mismatch";
  double w = 0, mean = 0;
  for (size_t i = 0; i < adv.size(); ++i) {
    w += double(tokens[i]);
    mean += adv[i] * double(tokens[i]);
  }
  if (w <= 0) return;
  mean /= w;
  double var = 0;
  for (size_t i = 0; i < adv.size(); ++i) var += double(tokens[i]) * (adv[i] - mean) * (adv[i] - mean);
  const double std = std::sqrt(var / w);
  for (double& a : adv) a = (a - mean) / (std + eps);
}

std::vector<double> importance_weights(const float* old_logp, const float* rollout_logp, int64_t n,
                                       const AlgoConfig& cfg, int64_t* corrected, const uint8_t* mask) {
  std::vector<double> w(size_t(n), 1.0);
  if (cfg.rollout_is == IsLevel::None || n == 0) return w;
  auto keep = [&](int64_t t) { return mask == nullptr || mask[t] != 0; };
  double sum = 0;
  int64_t kept = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (!keep(t)) continue;
    const double lr = double(old_logp[t]) - double(rollout_logp[t]);
    w[size_t(t)] = safe_exp(lr);
    sum += lr;
    ++kept;
  }
  for (int64_t t = 0; t < n; ++t) {
    if (!keep(t)) continue;
    if (cfg.rollout_is == IsLevel::Sequence) w[size_t(t)] = safe_exp(sum);
    if (cfg.rollout_is == IsLevel::Geometric) w[size_t(t)] = safe_exp(sum / double(std::max<int64_t>(kept, 1)));
  }
  const double hi = cfg.rollout_is_threshold;
  const double lo = cfg.rollout_is_threshold_lower > 0 ? cfg.rollout_is_threshold_lower : 1.0 / hi;
  for (int64_t t = 0; t < n; ++t) {
    if (!keep(t)) continue;
    double& x = w[size_t(t)];
    if (cfg.rollout_is_mode == IsMode::Truncate) {
      if (x > hi) {
        x = hi;
        if (corrected) ++*corrected;
      }
    } else if (x > hi || x < lo) {
      x = 0.0;
      if (corrected) ++*corrected;
    }
  }
  return w;
}

double token_weight(LossAgg agg, int64_t n, int64_t total_tokens, int64_t num_seqs, int64_t norm_len) {
  if (n <= 0) return 0.0;
  switch (agg) {
    case LossAgg::TokenMean:
      return 1.0 / double(std::max<int64_t>(total_tokens, 1));
    case LossAgg::SeqMeanTokenMean:
      return 1.0 / (double(std::max<int64_t>(num_seqs, 1)) * double(n));
    case LossAgg::SeqMeanTokenSum:
      return 1.0 / double(std::max<int64_t>(num_seqs, 1));
    case LossAgg::SeqMeanTokenSumNorm:
      LS_CHECK(norm_len > 0) << "seq-mean-token-sum-norm needs a positive normalising length";
      return 1.0 / (double(std::max<int64_t>(num_seqs, 1)) * double(norm_len));
  }
  return 0.0;
}

double sequence_loss(const AlgoConfig& cfg, const SeqLossInput& in, float* dlogp, float* dentropy,
                     SeqLossStats* stats) {
  SeqLossStats st;
  const double w = in.token_weight;
  const double lo = 1.0 - cfg.eps_clip, hi = 1.0 + cfg.eps_clip_high;
  // GSPO: one ratio per sequence, exp of the mean log-ratio; each token's
  // term has that value and d/dlogp_t = ratio (the token-level form, so the
  // aggregation decides how tokens weigh).
  auto keep = [&](int64_t t) { return in.mask == nullptr || in.mask[t] != 0; };
  double seq_ratio = 0;
  if (cfg.policy_loss == PolicyLoss::Gspo && in.n > 0) {
    double s = 0;
    int64_t kept = 0;
    for (int64_t t = 0; t < in.n; ++t)
      if (keep(t)) {
        s += double(in.logp[t]) - double(in.old_logp[t]);
        ++kept;
      }
    seq_ratio = safe_exp(s / double(std::max<int64_t>(kept, 1)));
  }
  double loss = 0;
  for (int64_t t = 0; t < in.n; ++t) {
    if (!keep(t)) {  // not the model's token: no term, no gradient
      dlogp[t] = 0.0f;
      if (dentropy) dentropy[t] = 0.0f;
      continue;
    }
    const double A = in.token_advantage ? in.token_advantage[t] : in.advantage;
    const double logp = in.logp[t], old = in.old_logp[t];
    const double isw = in.is_weight ? in.is_weight[t] : 1.0;
    const double ratio = cfg.policy_loss == PolicyLoss::Gspo ? seq_ratio : safe_exp(logp - old);
    double pg = 0, dpg = 0;
    bool clipped = false;
    if (cfg.policy_loss == PolicyLoss::Cispo) {
      // -sg(clip(ratio)) * A * logp: the gradient always flows, scaled by the
      // clipped weight; the reported value is -clip(ratio) * A.
      const double cw = std::clamp(ratio, lo, hi);
      clipped = ratio < lo || ratio > hi;
      pg = -cw * A;
      dpg = -cw * A;
    } else {
      const double unclipped = -A * ratio;
      const double clip_r = std::clamp(ratio, lo, hi);
      const double clip_term = -A * clip_r;
      if (clip_term > unclipped) {  // the clipped branch wins: no gradient
        pg = clip_term;
        dpg = 0;
        clipped = true;
      } else {
        pg = unclipped;
        dpg = -A * ratio;
      }
      if (cfg.eps_clip_c > 1 && A < 0 && pg > -A * cfg.eps_clip_c) {  // dual clip
        pg = -A * cfg.eps_clip_c;
        dpg = 0;
        clipped = true;
      }
    }
    double term = isw * pg, dterm = isw * dpg;
    if (in.ref_logp) {
      const double d = logp - double(in.ref_logp[t]);
      double kl = 0, dkl = 0;
      switch (cfg.kl_type) {
        case KlType::K1:
          kl = d;
          dkl = 1;
          break;
        case KlType::K2:
          kl = 0.5 * d * d;
          dkl = d;
          break;
        case KlType::K3: {
          const double e = safe_exp(-d);
          kl = e + d - 1;
          dkl = 1 - e;
          break;
        }
      }
      term += cfg.kl_coef * kl;
      dterm += cfg.kl_coef * dkl;
      st.kl += w * kl;
    }
    if (in.entropy) {
      term -= cfg.entropy_coef * double(in.entropy[t]);
      st.entropy += w * double(in.entropy[t]);
      if (dentropy) dentropy[t] = float(-cfg.entropy_coef * w);
    } else if (dentropy) {
      dentropy[t] = 0.0f;
    }
    dlogp[t] = float(w * dterm);
    loss += w * term;
    st.pg_loss += w * isw * pg;
    st.clipped += clipped ? 1 : 0;
    st.ratio_sum += ratio;
    st.approx_kl += old - logp;
  }
  if (stats) *stats = st;
  return loss;
}

}  // namespace lockstep::rl
