// The RL update math against hand-computed values and finite differences.
#include "lockstep/rl/algo.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "lockstep/base/error.h"

namespace lockstep::rl {
namespace {

TEST(Advantages, GrpoUsesGroupMeanAndUnbiasedStd) {
  const auto a = group_advantages({1, 0, 0, 1}, Advantage::Grpo, 1e-6);
  // mean 0.5, std = sqrt(4 * 0.25 / 3) = 0.57735
  EXPECT_NEAR(a[0], 0.5 / (std::sqrt(1.0 / 3.0) + 1e-6), 1e-12);
  EXPECT_NEAR(a[1], -0.5 / (std::sqrt(1.0 / 3.0) + 1e-6), 1e-12);
  EXPECT_NEAR(a[0], 0.866024, 1e-5);
}

TEST(Advantages, DrGrpoRlooAndDegenerateGroups) {
  const auto d = group_advantages({1, 0, 0, 1}, Advantage::DrGrpo, 1e-6);
  EXPECT_DOUBLE_EQ(d[0], 0.5);
  EXPECT_DOUBLE_EQ(d[1], -0.5);
  // RLOO: r_i minus the mean of the others.
  const auto r = group_advantages({1, 0, 0, 0}, Advantage::Rloo, 1e-6);
  EXPECT_NEAR(r[0], 1.0, 1e-12);
  EXPECT_NEAR(r[1], -1.0 / 3.0, 1e-12);
  const auto rp = group_advantages({2, 1}, Advantage::ReinforcePP, 1e-6);
  EXPECT_DOUBLE_EQ(rp[0], 0.5);
  // A group whose rewards agree carries no signal; one sample has no baseline.
  for (auto kind : {Advantage::Grpo, Advantage::DrGrpo, Advantage::Rloo}) {
    for (double x : group_advantages({0.3, 0.3, 0.3}, kind, 1e-6)) EXPECT_EQ(x, 0.0);
    EXPECT_EQ(group_advantages({1.0}, kind, 1e-6)[0], 0.0);
  }
}

TEST(Advantages, ReinforcePlusPlusWhitensOverTokens) {
  std::vector<double> a = {1, -1};
  whiten_advantages(a, {1, 3}, 0.0);
  // token mean -0.5, token variance (2.25 + 3 * 0.25) / 4 = 0.75
  EXPECT_NEAR(a[0], 1.5 / std::sqrt(0.75), 1e-12);
  EXPECT_NEAR(a[1], -0.5 / std::sqrt(0.75), 1e-12);
}

TEST(Overlong, SoftPenaltyIsLinearInTheBuffer) {
  EXPECT_EQ(overlong_penalty(12, 16, 4, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(overlong_penalty(14, 16, 4, 1.0), -0.5);
  EXPECT_DOUBLE_EQ(overlong_penalty(16, 16, 4, 2.0), -2.0);
  EXPECT_DOUBLE_EQ(overlong_penalty(13, 16, 4, 1.0), -0.25);
  EXPECT_EQ(overlong_penalty(16, 16, 0, 1.0), 0.0);  // off
}

TEST(ImportanceWeights, TokenSequenceGeometricTruncateMask) {
  const float old_lp[] = {-1.0f, -2.0f}, roll[] = {-1.5f, -1.0f};  // log-ratios 0.5, -1
  AlgoConfig c;
  c.rollout_is = IsLevel::Token;
  c.rollout_is_threshold = 1.5;
  int64_t corrected = 0;
  auto w = importance_weights(old_lp, roll, 2, c, &corrected);
  EXPECT_DOUBLE_EQ(w[0], 1.5);  // e^0.5 = 1.6487 truncated
  EXPECT_NEAR(w[1], std::exp(-1.0), 1e-7);
  EXPECT_EQ(corrected, 1);
  c.rollout_is = IsLevel::Sequence;
  w = importance_weights(old_lp, roll, 2, c, nullptr);
  EXPECT_NEAR(w[0], std::exp(-0.5), 1e-7);
  EXPECT_EQ(w[0], w[1]);
  c.rollout_is = IsLevel::Geometric;
  w = importance_weights(old_lp, roll, 2, c, nullptr);
  EXPECT_NEAR(w[1], std::exp(-0.25), 1e-7);
  // MIS: weights outside [1/1.5, 1.5] are masked to 0.
  c.rollout_is = IsLevel::Token;
  c.rollout_is_mode = IsMode::Mask;
  corrected = 0;
  w = importance_weights(old_lp, roll, 2, c, &corrected);
  EXPECT_EQ(w[0], 0.0);
  EXPECT_EQ(w[1], 0.0);
  EXPECT_EQ(corrected, 2);
  c.rollout_is_threshold_lower = 0.3;
  corrected = 0;
  w = importance_weights(old_lp, roll, 2, c, &corrected);
  EXPECT_NEAR(w[1], std::exp(-1.0), 1e-7);
  EXPECT_EQ(corrected, 1);
  c.rollout_is = IsLevel::None;
  w = importance_weights(old_lp, roll, 2, c, nullptr);
  EXPECT_EQ(w[0], 1.0);
}

TEST(Aggregation, TokenWeights) {
  EXPECT_DOUBLE_EQ(token_weight(LossAgg::TokenMean, 5, 20, 4, 0), 1.0 / 20);
  EXPECT_DOUBLE_EQ(token_weight(LossAgg::SeqMeanTokenMean, 5, 20, 4, 0), 1.0 / 20);
  EXPECT_DOUBLE_EQ(token_weight(LossAgg::SeqMeanTokenMean, 10, 20, 4, 0), 1.0 / 40);
  EXPECT_DOUBLE_EQ(token_weight(LossAgg::SeqMeanTokenSum, 10, 20, 4, 0), 1.0 / 4);
  EXPECT_DOUBLE_EQ(token_weight(LossAgg::SeqMeanTokenSumNorm, 10, 20, 4, 64), 1.0 / 256);
  EXPECT_EQ(token_weight(LossAgg::TokenMean, 0, 20, 4, 0), 0.0);
}

// One token's PPO term at a given ratio and advantage.
double ppo_term(const AlgoConfig& c, double ratio, double adv, float* grad, bool* clipped) {
  const float old_lp = -1.0f;
  const float lp = float(-1.0 + std::log(ratio));
  SeqLossInput in;
  in.logp = &lp;
  in.old_logp = &old_lp;
  in.n = 1;
  in.advantage = adv;
  in.token_weight = 1.0;
  SeqLossStats st;
  const double l = sequence_loss(c, in, grad, nullptr, &st);
  *clipped = st.clipped == 1;
  return l;
}

TEST(PolicyLoss, PpoClipHigherAndDualClip) {
  AlgoConfig c;
  c.eps_clip = 0.2;
  c.eps_clip_high = 0.28;
  float g = 0;
  bool clipped = false;
  // A > 0, ratio 1.5 beyond 1.28: clipped, no gradient.
  EXPECT_NEAR(ppo_term(c, 1.5, 1.0, &g, &clipped), -1.28, 1e-6);
  EXPECT_EQ(g, 0.0f);
  EXPECT_TRUE(clipped);
  // A > 0, ratio 1.1 inside: -A r, gradient -A r.
  EXPECT_NEAR(ppo_term(c, 1.1, 1.0, &g, &clipped), -1.1, 1e-6);
  EXPECT_NEAR(g, -1.1, 1e-6);
  EXPECT_FALSE(clipped);
  // A < 0, ratio 0.5 below 0.8: the clipped term (0.8) is larger: clipped.
  EXPECT_NEAR(ppo_term(c, 0.5, -1.0, &g, &clipped), 0.8, 1e-6);
  EXPECT_EQ(g, 0.0f);
  EXPECT_TRUE(clipped);
  // A < 0, ratio 5: unclipped 5 wins without dual clip...
  EXPECT_NEAR(ppo_term(c, 5.0, -1.0, &g, &clipped), 5.0, 1e-5);
  EXPECT_NEAR(g, 5.0, 1e-5);
  // ... and is capped at c * |A| = 3 with it.
  c.eps_clip_c = 3.0;
  EXPECT_NEAR(ppo_term(c, 5.0, -1.0, &g, &clipped), 3.0, 1e-6);
  EXPECT_EQ(g, 0.0f);
  EXPECT_TRUE(clipped);
}

TEST(PolicyLoss, CispoKeepsTheGradientWithAClippedWeight) {
  AlgoConfig c;
  c.policy_loss = PolicyLoss::Cispo;
  c.eps_clip = 0.2;
  c.eps_clip_high = 0.28;
  float g = 0;
  bool clipped = false;
  EXPECT_NEAR(ppo_term(c, 1.5, 2.0, &g, &clipped), -1.28 * 2.0, 1e-6);
  EXPECT_NEAR(g, -1.28 * 2.0, 1e-6);  // PPO would give 0 here
  EXPECT_TRUE(clipped);
  EXPECT_NEAR(ppo_term(c, 1.1, 2.0, &g, &clipped), -2.2, 1e-6);
  EXPECT_NEAR(g, -2.2, 1e-6);
  EXPECT_FALSE(clipped);
}

TEST(PolicyLoss, GspoUsesTheSequenceRatio) {
  AlgoConfig c;
  c.policy_loss = PolicyLoss::Gspo;
  c.eps_clip = 0.5;
  c.eps_clip_high = 0.5;
  const float old_lp[] = {-1.0f, -1.0f}, lp[] = {-0.8f, -1.1f};  // mean log-ratio 0.05
  float g[2];
  SeqLossInput in;
  in.logp = lp;
  in.old_logp = old_lp;
  in.n = 2;
  in.advantage = 1.0;
  in.token_weight = 0.5;
  const double s = std::exp(0.05);
  EXPECT_NEAR(sequence_loss(c, in, g, nullptr, nullptr), -s, 1e-6);
  EXPECT_NEAR(g[0], -0.5 * s, 1e-6);
  EXPECT_EQ(g[0], g[1]);  // every token carries the sequence ratio
}

// Finite differences of the whole per-sequence loss (PPO in its unclipped
// region, GSPO, KL k1/k2/k3, entropy bonus, importance weights). GSPO's
// token-level form equals the sequence loss's gradient when every token
// carries the same importance weight (sequence or geometric level).
void check_fd(AlgoConfig c) {
  const int n = 4;
  std::vector<float> lp = {-1.2f, -0.4f, -2.0f, -0.9f}, old_lp = {-1.25f, -0.35f, -2.05f, -0.92f};
  std::vector<float> ref = {-1.0f, -0.7f, -1.6f, -1.3f}, ent = {1.1f, 0.3f, 2.2f, 0.7f};
  std::vector<double> isw = {1.0, 0.7, 1.3, 0.9};
  if (c.policy_loss == PolicyLoss::Gspo) isw.assign(4, 0.8);
  auto loss = [&](const std::vector<float>& l, const std::vector<float>& e, float* dl, float* de) {
    SeqLossInput in;
    in.logp = l.data();
    in.entropy = e.data();
    in.old_logp = old_lp.data();
    in.ref_logp = c.kl_coef > 0 ? ref.data() : nullptr;
    in.is_weight = isw.data();
    in.n = n;
    in.advantage = 0.7;
    in.token_weight = 0.25;
    std::vector<float> a(n), b(n);
    return sequence_loss(c, in, dl ? dl : a.data(), de ? de : b.data(), nullptr);
  };
  std::vector<float> dl(n), de(n);
  loss(lp, ent, dl.data(), de.data());
  const double h = 1e-2;
  for (int i = 0; i < n; ++i) {
    auto p = lp, m = lp;
    p[size_t(i)] += float(h);
    m[size_t(i)] -= float(h);
    const double fd = (loss(p, ent, nullptr, nullptr) - loss(m, ent, nullptr, nullptr)) /
                      (double(p[size_t(i)]) - double(m[size_t(i)]));
    EXPECT_NEAR(dl[size_t(i)], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << "logp " << i;
    auto ep = ent, em = ent;
    ep[size_t(i)] += float(h);
    em[size_t(i)] -= float(h);
    const double fde = (loss(lp, ep, nullptr, nullptr) - loss(lp, em, nullptr, nullptr)) /
                       (double(ep[size_t(i)]) - double(em[size_t(i)]));
    EXPECT_NEAR(de[size_t(i)], fde, 1e-4) << "entropy " << i;
  }
}

TEST(PolicyLoss, GradientsMatchFiniteDifferences) {
  AlgoConfig c;
  c.eps_clip = 0.5;
  c.eps_clip_high = 0.5;  // every ratio inside: the loss is smooth
  c.entropy_coef = 0.01;
  check_fd(c);
  for (KlType k : {KlType::K1, KlType::K2, KlType::K3}) {
    c.kl_coef = 0.1;
    c.kl_type = k;
    check_fd(c);
  }
  c.policy_loss = PolicyLoss::Gspo;
  check_fd(c);
}

TEST(PolicyLoss, KlValuesByHand) {
  AlgoConfig c;
  c.kl_coef = 1.0;
  c.eps_clip = 0.5;
  const float lp = -1.0f, ref = -1.5f, old_lp = -1.0f;  // d = logp - ref = 0.5
  SeqLossInput in;
  in.logp = &lp;
  in.old_logp = &old_lp;
  in.ref_logp = &ref;
  in.n = 1;
  in.advantage = 0.0;
  in.token_weight = 1.0;
  float g = 0;
  SeqLossStats st;
  c.kl_type = KlType::K1;
  sequence_loss(c, in, &g, nullptr, &st);
  EXPECT_NEAR(st.kl, 0.5, 1e-7);
  c.kl_type = KlType::K2;
  sequence_loss(c, in, &g, nullptr, &st);
  EXPECT_NEAR(st.kl, 0.125, 1e-7);
  c.kl_type = KlType::K3;
  sequence_loss(c, in, &g, nullptr, &st);
  EXPECT_NEAR(st.kl, std::exp(-0.5) + 0.5 - 1.0, 1e-7);
  EXPECT_NEAR(g, 1.0 - std::exp(-0.5), 1e-6);
}

TEST(AlgoConfig, ReadsKeysAndRejectsBadValues) {
  auto parse = [](const std::string& text) {
    toml::table t = parse_toml_with_overrides(text, "algo.toml", {});
    TomlSection s(t["algo"].as_table(), "algo.toml", "algo");
    AlgoConfig c = algo_config_from_toml(s);
    s.finish();
    return c;
  };
  const AlgoConfig c = parse(
      "[algo]\nadvantage = \"rloo\"\npolicy_loss = \"gspo\"\neps_clip = 0.1\nloss_agg = \"seq-mean-token-mean\"\n"
      "kl_coef = 0.05\nkl_type = \"k2\"\nrollout_is = \"geometric\"\nrollout_is_mode = \"mask\"\n"
      "dynamic_sampling = true\n");
  EXPECT_EQ(c.advantage, Advantage::Rloo);
  EXPECT_EQ(c.policy_loss, PolicyLoss::Gspo);
  EXPECT_DOUBLE_EQ(c.eps_clip_high, 0.1);  // defaults to eps_clip
  EXPECT_EQ(c.loss_agg, LossAgg::SeqMeanTokenMean);
  EXPECT_EQ(c.kl_type, KlType::K2);
  EXPECT_EQ(c.rollout_is, IsLevel::Geometric);
  EXPECT_EQ(c.rollout_is_mode, IsMode::Mask);
  EXPECT_TRUE(c.dynamic_sampling);
  auto message = [&](const std::string& text) {
    try {
      parse(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("[algo]\nadvantage = \"ppo\"\n").find("advantage"), std::string::npos);
  EXPECT_NE(message("[algo]\nclip = 0.2\n").find("clip"), std::string::npos);
  EXPECT_NE(message("[algo]\neps_clip_c = 0.5\n").find("eps_clip_c"), std::string::npos);
  EXPECT_NE(message("[algo]\nnum_steps_per_rollout = 0\n").find("num_steps_per_rollout"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::rl
