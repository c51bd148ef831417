// GAE advantages, returns and their whitening against a plain double
// reference written out here, and per-token advantages through the policy loss.
#include "lockstep/rl/gae.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/rl/algo.h"

namespace lockstep::rl {
namespace {

// GAE as its definition reads: A_t = sum_{l >= 0} (gamma lam)^l delta_{t+l},
// each delta from the rewards (only the last token's nonzero) and values.
std::vector<double> reference_gae(const std::vector<float>& v, double reward, double gamma, double lam) {
  const size_t n = v.size();
  std::vector<double> delta(n), adv(n, 0.0);
  for (size_t t = 0; t < n; ++t) {
    const double next = t + 1 < n ? double(v[t + 1]) : 0.0;
    delta[t] = (t + 1 == n ? reward : 0.0) + gamma * next - double(v[t]);
  }
  for (size_t t = 0; t < n; ++t)
    for (size_t l = 0; t + l < n; ++l) adv[t] += std::pow(gamma * lam, double(l)) * delta[t + l];
  return adv;
}

TEST(Gae, MatchesTheDefinitionForEveryGammaAndLambda) {
  const std::vector<float> values = {0.3f, -0.2f, 0.7f, 0.1f, 0.45f};
  for (double gamma : {1.0, 0.9, 0.5})
    for (double lam : {1.0, 0.95, 0.3, 0.0}) {
      std::vector<double> adv(values.size()), ret(values.size());
      gae_advantages(values.data(), int64_t(values.size()), 1.5, gamma, lam, adv.data(), ret.data());
      const std::vector<double> want = reference_gae(values, 1.5, gamma, lam);
      for (size_t t = 0; t < values.size(); ++t) {
        EXPECT_NEAR(adv[t], want[t], 1e-12) << "gamma " << gamma << " lam " << lam << " t " << t;
        EXPECT_NEAR(ret[t], want[t] + double(values[t]), 1e-12);
      }
    }
}

TEST(Gae, GammaAndLambdaOneGiveRewardMinusValue) {
  // The recipe's defaults: A_t = R - V_t, the return is the reward everywhere.
  const std::vector<float> values = {0.25f, 0.5f, -1.0f};
  std::vector<double> adv(3), ret(3);
  gae_advantages(values.data(), 3, 1.0, 1.0, 1.0, adv.data(), ret.data());
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_DOUBLE_EQ(adv[t], 1.0 - double(values[t]));
    EXPECT_DOUBLE_EQ(ret[t], 1.0);
  }
  // lam = 0: the one-step TD error.
  gae_advantages(values.data(), 3, 1.0, 0.9, 0.0, adv.data(), ret.data());
  EXPECT_NEAR(adv[0], 0.9 * 0.5 - 0.25, 1e-12);
  EXPECT_NEAR(adv[2], 1.0 + 1.0, 1e-12);
}

TEST(Gae, WhiteningUsesTheUnbiasedVarianceOverAllTokens) {
  std::vector<std::vector<double>> adv = {{1.0, 2.0, 3.0}, {5.0}, {}};
  // mean 2.75; squared deviations 3.0625 + 0.5625 + 0.0625 + 5.0625 = 8.75; var = 8.75 / 3
  const double mean = 2.75, sd = std::sqrt(8.75 / 3.0 + 1e-8);
  const std::vector<std::vector<double>> raw = adv;
  whiten_token_advantages(adv);
  double sum = 0;
  for (size_t i = 0; i < adv.size(); ++i)
    for (size_t t = 0; t < adv[i].size(); ++t) {
      EXPECT_NEAR(adv[i][t], (raw[i][t] - mean) / sd, 1e-12);
      sum += adv[i][t];
    }
  EXPECT_NEAR(sum, 0.0, 1e-12);
  std::vector<std::vector<double>> one = {{4.0}};
  whiten_token_advantages(one);
  EXPECT_EQ(one[0][0], 0.0);
}

TEST(Gae, PerTokenAdvantagesReachTheLoss) {
  AlgoConfig c;
  const std::vector<float> logp = {-1.0f, -0.5f, -2.0f}, old = {-1.1f, -0.5f, -1.9f};
  const std::vector<double> adv = {0.5, -1.0, 2.0};
  std::vector<float> dlogp(3), dscalar(3);
  SeqLossInput in;
  in.logp = logp.data();
  in.old_logp = old.data();
  in.n = 3;
  in.token_weight = 0.25;
  in.advantage = 7.0;  // ignored once the per-token array is given
  in.token_advantage = adv.data();
  const double loss = sequence_loss(c, in, dlogp.data(), nullptr, nullptr);
  double want = 0;
  for (size_t t = 0; t < 3; ++t) {
    // Each token alone with its advantage as the scalar: the same term and gradient.
    SeqLossInput one = in;
    one.logp = &logp[t];
    one.old_logp = &old[t];
    one.n = 1;
    one.token_advantage = nullptr;
    one.advantage = adv[t];
    float g = 0;
    want += sequence_loss(c, one, &g, nullptr, nullptr);
    EXPECT_EQ(dlogp[t], g) << t;
  }
  EXPECT_DOUBLE_EQ(loss, want);
  // A null array is the scalar for every token.
  in.token_advantage = nullptr;
  const std::vector<double> same(3, 7.0);
  SeqLossInput arr = in;
  arr.token_advantage = same.data();
  EXPECT_EQ(sequence_loss(c, in, dscalar.data(), nullptr, nullptr),
            sequence_loss(c, arr, dlogp.data(), nullptr, nullptr));
  for (size_t t = 0; t < 3; ++t) EXPECT_EQ(dscalar[t], dlogp[t]);
}

TEST(Gae, ConfigReadsGammaLamAndRefusesOutOfRange) {
  auto parse = [](const std::string& text) {
    toml::table t = parse_toml_with_overrides(text, "algo.toml", {});
    TomlSection s(t["algo"].as_table(), "algo.toml", "algo");
    AlgoConfig c = algo_config_from_toml(s);
    s.finish();
    return c;
  };
  const AlgoConfig c = parse("[algo]\nadvantage = \"gae\"\ngamma = 0.99\nlam = 0.95\n");
  EXPECT_EQ(c.advantage, Advantage::Gae);
  EXPECT_EQ(to_string(c.advantage), "gae");
  EXPECT_DOUBLE_EQ(c.gamma, 0.99);
  EXPECT_DOUBLE_EQ(c.lam, 0.95);
  for (const char* bad : {"[algo]\ngamma = 1.5\n", "[algo]\nlam = -0.1\n"}) {
    std::string what = "no error";
    try {
      parse(bad);
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(std::string(bad).find("gamma") != std::string::npos ? "gamma" : "lam"),
              std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace lockstep::rl
