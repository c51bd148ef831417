// DeepSeek-V4's MTP loss in the trainer ([train] mtp_loss_coef): the
// loss gains coef x the MTP blocks' mean cross-entropy, exactly as computed
// from the forward's MTP logits; the MTP blocks get gradient only when the
// coefficient is set; and a model without MTP blocks refuses the key.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/v4_config.h"
#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/softmax.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

ModelConfig mtp_config() {
  ModelConfig c = test::tiny_v4();
  c.num_nextn_predict_layers = 1;
  c.compress_ratios.push_back(0);
  return c;
}

std::vector<TrainSequence> sequences() {
  std::mt19937 g(3);
  std::vector<TrainSequence> seqs;
  for (int len : {12, 7, 20}) {
    TrainSequence s;
    for (int i = 0; i < len; ++i) s.tokens.push_back(int32_t(g() % 48));
    s.prompt_len = 3;
    seqs.push_back(s);
  }
  return seqs;
}

Buffer init(const ModelConfig& c) {
  ParamLayout layout(c);
  Buffer b = alloc_params(layout);
  init_params(layout, b.as<float>(), 5, 0.3f);
  return b;
}

// The SFT-style loss: mean negative logprob of the response tokens.
LossFn nll(const std::vector<TrainSequence>& seqs) {
  int64_t n = 0;
  for (const auto& s : seqs) n += s.num_targets();
  return [n](size_t, const float* logp, const float*, int64_t k, float* dlogp, float*) {
    double l = 0;
    for (int64_t i = 0; i < k; ++i) {
      l -= double(logp[i]) / double(n);
      dlogp[i] = float(-1.0 / double(n));
    }
    return l;
  };
}

// The MTP block's mean cross-entropy over the targets the loss masks keep,
// from its own forward.
double mtp_cross_entropy(const Context& ctx, const model::ModelWeights& w, const std::vector<TrainSequence>& seqs) {
  double total = 0;
  int64_t count = 0;
  for (const auto& s : seqs) {
    model::RaggedBatch b(8);
    std::vector<int32_t> blocks = {0, 1, 2, 3, 4, 5, 6, 7};
    b.add_sequence(s.tokens.data(), int32_t(s.tokens.size()), 0, blocks.data(), 8);
    for (int32_t p = s.prompt_len - 1; p + 2 < int32_t(s.tokens.size()); ++p) b.logit_rows.push_back(p);
    model::KvCache kv(w.config(), 8, 16);
    model::Workspace ws;
    model::ForwardResult r;
    model::ForwardOptions o;
    o.mtp = true;
    model::forward(ctx, w, kv, ws, b, o, &r);
    const int64_t V = w.config().vocab_size;
    for (size_t k = 0; k < b.logit_rows.size(); ++k) {
      const int32_t target = b.logit_rows[k] + 2;
      if (!s.loss_mask.empty() && !s.loss_mask[size_t(target - s.prompt_len)]) continue;
      const float* row = r.mtp_logits[0].f32() + int64_t(k) * V;
      double mx = row[0], z = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
      total -= double(row[s.tokens[size_t(b.logit_rows[k] + 2)]]) - mx - std::log(z);
      ++count;
    }
  }
  return total / double(count);
}

TEST(V4Mtp, TheLossGainsTheMtpTermAndOnlyThenTheMtpBlockLearns) {
  const ModelConfig c = mtp_config();
  const Context ctx{nullptr, 0};
  const auto seqs = sequences();
  TrainerConfig plain, with_mtp;
  with_mtp.mtp_loss_coef = 0.3;
  Trainer a(ctx, c, init(c), plain), b(ctx, c, init(c), with_mtp);
  const double la = a.accumulate(seqs, nll(seqs), {}), lb = b.accumulate(seqs, nll(seqs), {});
  const double ce = mtp_cross_entropy(ctx, a.weights(), seqs);
  EXPECT_NEAR(lb - la, 0.3 * ce, 1e-4 * std::fabs(ce));
  const ParamInfo& e_proj = a.layout().at("mtp.0.e_proj.weight");
  double ga = 0, gb = 0;
  for (int64_t i = 0; i < e_proj.numel; ++i) {
    ga += std::fabs(a.grads()[e_proj.offset + i]);
    gb += std::fabs(b.grads()[e_proj.offset + i]);
  }
  EXPECT_EQ(ga, 0.0);
  EXPECT_GT(gb, 0.0);
}

// Multi-turn sequences: the tokens loss_mask drops (an environment's) are no
// MTP targets either, in the sum and in the mean's count.
TEST(V4Mtp, MaskedTokensAreNoMtpTargets) {
  const ModelConfig c = mtp_config();
  const Context ctx{nullptr, 0};
  auto seqs = sequences();
  for (auto& s : seqs) {
    s.loss_mask.assign(size_t(s.num_targets()), 1);
    for (size_t k = 2; k < s.loss_mask.size(); k += 3) s.loss_mask[k] = 0;
  }
  auto unmasked = seqs;
  for (auto& s : unmasked) s.loss_mask.clear();
  TrainerConfig plain, with_mtp;
  with_mtp.mtp_loss_coef = 0.3;
  Trainer a(ctx, c, init(c), plain), b(ctx, c, init(c), with_mtp);
  const double la = a.accumulate(seqs, nll(seqs), {}), lb = b.accumulate(seqs, nll(seqs), {});
  const double ce = mtp_cross_entropy(ctx, a.weights(), seqs);
  EXPECT_NEAR(lb - la, 0.3 * ce, 1e-4 * std::fabs(ce));
  // Different from the unmasked term (the test would not see a missing mask otherwise).
  EXPECT_GT(std::fabs(ce - mtp_cross_entropy(ctx, a.weights(), unmasked)), 1e-3);
}

TEST(V4Mtp, AModelWithoutMtpBlocksRefusesTheCoefficient) {
  const ModelConfig c = test::tiny_v4();
  TrainerConfig tc;
  tc.mtp_loss_coef = 0.1;
  EXPECT_THROW(Trainer(Context{nullptr, 0}, c, init(c), tc), Error);
}

}  // namespace
}  // namespace lockstep::train
