// The critic: its value head and body gradient against finite differences,
// values that do not depend on the micro-batch cut, the clipped value loss by
// hand, and a save/load round trip.
#include "lockstep/train/critic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "common/small_models.h"
#include "lockstep/model/params.h"

namespace lockstep::train {
namespace {

ModelConfig dense() {
  ModelConfig c = test::small_tied_dense();
  c.tie_word_embeddings = false;  // an lm_head the critic must leave alone
  return c;
}

std::vector<TrainSequence> sequences() {
  std::vector<TrainSequence> seqs;
  const std::vector<std::vector<int32_t>> toks = {
      {3, 17, 5, 9, 40, 2, 7}, {11, 4, 90, 33}, {8, 1, 2, 3, 4, 5, 6, 7, 99}};
  const std::vector<int32_t> prompt = {3, 2, 4};
  for (size_t i = 0; i < toks.size(); ++i) {
    TrainSequence s;
    s.tokens = toks[i];
    s.prompt_len = prompt[i];
    seqs.push_back(s);
  }
  return seqs;
}

std::unique_ptr<Critic> make_critic(int64_t micro_batch_tokens = 1 << 20, bool recompute = false) {
  const ModelConfig c = dense();
  ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 23, 0.3f);
  CriticConfig cc;
  cc.micro_batch_tokens = micro_batch_tokens;
  cc.optim.lr = 1e-2;
  cc.recompute_activations = recompute;
  auto critic = std::make_unique<Critic>(Context{}, c, std::move(p), cc);
  // A nonzero head, so the body's gradient is not zero.
  for (int64_t d = 0; d <= c.hidden_size; ++d)
    critic->head()[d] = float(0.3 * std::sin(1.7 * double(d) + 0.4));
  return critic;
}

// The smooth test loss: sum_t 0.5 (v_t - target_t)^2 over every response token.
double target(size_t i, int64_t t) {
  return 0.5 * std::cos(double(i) + 0.7 * double(t));
}

double loss_of(const std::vector<std::vector<float>>& v) {
  double l = 0;
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t t = 0; t < v[i].size(); ++t) l += 0.5 * std::pow(double(v[i][t]) - target(i, int64_t(t)), 2);
  return l;
}

// The same loss as the critic sees it: its value and dloss/dv of sequence i's n values.
double smooth_loss(size_t i, const float* v, int64_t n, float* dv) {
  double l = 0;
  for (int64_t t = 0; t < n; ++t) {
    const double e = double(v[t]) - target(i, t);
    l += 0.5 * e * e;
    dv[t] = float(e);
  }
  return l;
}

TEST(Critic, HeadAndBodyGradientsMatchFiniteDifferences) {
  auto critic = make_critic();
  const auto seqs = sequences();
  const ValueLossFn loss = smooth_loss;
  const double l0 = critic->accumulate(seqs, loss);
  EXPECT_NEAR(l0, loss_of(critic->values(seqs)), 1e-9 * std::max(1.0, l0));
  Trainer& body = critic->body();
  const ParamLayout& layout = body.layout();
  std::vector<float> grads(body.grads(), body.grads() + layout.numel());
  const std::vector<float> head_grads(critic->head_grads(), critic->head_grads() + dense().hidden_size + 1);
  // The lm_head is not on the value's path: no gradient.
  const ParamInfo& lm = layout.at("lm_head.weight");
  for (int64_t k = 0; k < lm.numel; ++k) ASSERT_EQ(grads[size_t(lm.offset + k)], 0.0f);
  // Central differences in double over a few entries of the body and head.
  const double eps = 2e-3;
  auto check = [&](float* x, double analytic, const std::string& what) {
    const float keep = *x;
    *x = float(double(keep) + eps);
    body.params_changed(body.version() + 1);
    const double up = loss_of(critic->values(seqs));
    *x = float(double(keep) - eps);
    body.params_changed(body.version() + 1);
    const double down = loss_of(critic->values(seqs));
    *x = keep;
    body.params_changed(body.version() + 1);
    const double fd = (up - down) / (2 * eps);
    EXPECT_NEAR(analytic, fd, 5e-3 * std::max(1.0, std::abs(fd))) << what;
  };
  int checked_nonzero = 0;
  for (const char* name :
       {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight",
        "model.embed_tokens.weight", "model.layers.1.input_layernorm.weight"}) {
    const ParamInfo& p = layout.at(name);
    for (int64_t k : {int64_t(0), p.numel / 3, p.numel - 5}) {
      // The embedding rows of tokens in the batch: row 3 (token 3) at offset 3 * D.
      const int64_t at =
          std::string(name) == "model.embed_tokens.weight" ? 3 * dense().hidden_size + k % 7 : k;
      const double g = grads[size_t(p.offset + at)];
      checked_nonzero += g != 0 ? 1 : 0;
      check(body.params() + p.offset + at, g, std::string(name) + "[" + std::to_string(at) + "]");
    }
  }
  EXPECT_GE(checked_nonzero, 10);
  for (int64_t d : {int64_t(0), int64_t(13), dense().hidden_size})  // the last: the bias
    check(critic->head() + d, head_grads[size_t(d)], "head[" + std::to_string(d) + "]");
}

TEST(Critic, ValuesDoNotDependOnTheMicroBatchCut) {
  const auto seqs = sequences();
  const auto whole = make_critic()->values(seqs);
  const auto cut = make_critic(5)->values(seqs);  // one sequence per micro-batch
  ASSERT_EQ(whole.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(int64_t(whole[i].size()), seqs[i].num_targets());
    for (size_t t = 0; t < whole[i].size(); ++t) EXPECT_EQ(whole[i][t], cut[i][t]) << i << " " << t;
  }
}

// With recompute_activations the critic keeps one layer's K/V (each layer's
// recompute writes its keys again before its attention backward): the loss,
// the body's and the head's gradients and the values have the same bits.
TEST(Critic, RecomputeGivesTheSameBits) {
  const auto seqs = sequences();
  const ValueLossFn loss = smooth_loss;
  for (int64_t mbt : {int64_t(1) << 20, int64_t(5)}) {
    auto plain = make_critic(mbt), recomputed = make_critic(mbt, true);
    const std::vector<std::vector<float>> v0 = recomputed->values(seqs);  // a scoring pass first
    const double l_plain = plain->accumulate(seqs, loss), l_re = recomputed->accumulate(seqs, loss);
    EXPECT_EQ(l_plain, l_re);
    const int64_t n = plain->body().layout().numel();
    int differ = 0;
    for (int64_t k = 0; k < n; ++k)
      differ += plain->body().grads()[k] != recomputed->body().grads()[k] ? 1 : 0;
    EXPECT_EQ(differ, 0) << "of " << n << " body gradients";
    for (int64_t d = 0; d <= dense().hidden_size; ++d)
      EXPECT_EQ(plain->head_grads()[d], recomputed->head_grads()[d]);
    const auto v1 = plain->values(seqs);
    ASSERT_EQ(v0.size(), v1.size());
    for (size_t i = 0; i < v0.size(); ++i) EXPECT_EQ(v0[i], v1[i]) << i;
  }
}

TEST(ValueLoss, ClippedAsVerlByHand) {
  // old 0, cliprange 0.5, returns 1: vpred 0.2 inside the range (unclipped term
  // 0.5 * 0.64); vpred -1 outside: vclip = -0.5, (vclip - R)^2 = 2.25 < 4, so
  // the unclipped term wins with its gradient; vpred 2 outside above: vclip =
  // 0.5, 0.25 vs 1, the unclipped wins; returns -1 with vpred 2: vclip 0.5 gives
  // 2.25 < 9 unclipped... and vpred 0.9 with returns 0.1, old 0: vclip 0.5,
  // 0.16 < 0.64 unclipped. A clipped case: old 0, vpred 1.4, return 1.5:
  // unclipped 0.01, clipped (0.5 - 1.5)^2 = 1: the clipped wins, no gradient.
  const std::vector<float> vpred = {0.2f, -1.0f, 1.4f}, old = {0.0f, 0.0f, 0.0f};
  const std::vector<double> ret = {1.0, 1.0, 1.5};
  std::vector<float> dv(3);
  ValueLossStats st;
  const double l = value_loss(vpred.data(), old.data(), ret.data(), nullptr, 3, 0.5, 0.25, dv.data(), &st);
  const double want = 0.25 * 0.5 * (0.64 + 4.0 + 1.0);
  EXPECT_NEAR(l, want, 1e-6);
  EXPECT_NEAR(dv[0], 0.25 * (0.2 - 1.0), 1e-7);
  EXPECT_NEAR(dv[1], 0.25 * (-2.0), 1e-7);
  EXPECT_EQ(dv[2], 0.0f);
  EXPECT_EQ(st.clipped, 1);
  EXPECT_NEAR(st.vpred_sum, 0.6, 1e-6);
  // A masked token adds nothing and gets no gradient.
  const std::vector<uint8_t> mask = {1, 0, 1};
  ValueLossStats sm;
  const double lm =
      value_loss(vpred.data(), old.data(), ret.data(), mask.data(), 3, 0.5, 0.25, dv.data(), &sm);
  EXPECT_NEAR(lm, 0.25 * 0.5 * (0.64 + 1.0), 1e-6);
  EXPECT_EQ(dv[1], 0.0f);
}

TEST(Critic, SaveAndLoadRoundTrip) {
  const auto seqs = sequences();
  auto a = make_critic();
  std::vector<std::vector<float>> old = a->values(seqs);
  std::vector<std::vector<double>> ret(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) ret[i].assign(old[i].size(), 1.0);
  const ValueLossFn loss = [&](size_t i, const float* v, int64_t n, float* dv) {
    return value_loss(v, old[i].data(), ret[i].data(), nullptr, n, 0.5, 0.1, dv, nullptr);
  };
  a->accumulate(seqs, loss);
  const OptimizerStats s = a->step();
  EXPECT_FALSE(s.skipped);
  EXPECT_GT(s.grad_norm, 0.0);
  const std::string dir = ::testing::TempDir() + "/critic_roundtrip";
  std::filesystem::remove_all(dir);
  a->save(dir);
  auto b = make_critic();
  b->load(dir);
  EXPECT_EQ(b->values(seqs), a->values(seqs));
  // The optimizer state came along: one more step on each gives the same bits.
  a->accumulate(seqs, loss);
  b->accumulate(seqs, loss);
  a->step();
  b->step();
  EXPECT_EQ(b->values(seqs), a->values(seqs));
  EXPECT_EQ(b->body().optimizer().steps_done(), 2);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::train
