// Mismatch metrics: hand-computed values, and the fast-mode promises — a
// bf16/fp8 rollout has a gap > 0, and routing replay makes the trainer use
// exactly the rollout's experts (router disagreement 0); replayed experts
// that the router would not choose are the ones the trainer uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lockstep/model/params.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/train/mismatch.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {

TEST(Mismatch, HandComputedValues) {
  // Sample 0: |d| = 0.1, 0.3 (mean 0.2); sample 1: |d| = 0 (mean 0). Mean over samples 0.1.
  std::vector<std::vector<float>> rollout = {{-1.0f, -2.0f}, {-0.5f}};
  std::vector<std::vector<float>> train = {{-1.1f, -1.7f}, {-0.5f}};
  MismatchStats s = compute_mismatch(rollout, train);
  EXPECT_NEAR(s.abs_diff_mean, 0.1, 1e-6);
  EXPECT_NEAR(s.abs_diff_max, 0.3, 1e-6);
  const double r0 = double(-1.1f) - double(-1.0f), r1 = double(-1.7f) - double(-2.0f);
  EXPECT_NEAR(s.kl_k3, ((std::exp(r0) - 1 - r0) + (std::exp(r1) - 1 - r1) + 0.0) / 3.0, 1e-12);
  EXPECT_NEAR(s.bitwise_equal_frac, 1.0 / 3.0, 1e-12);
  EXPECT_EQ(s.tokens, 3);
  auto j = s.to_json();
  EXPECT_TRUE(j.contains("train/train_rollout_logprob_abs_diff"));
  EXPECT_TRUE(j.contains("train/train_rollout_kl"));
  EXPECT_THROW(compute_mismatch({{1.0f}}, {{1.0f, 2.0f}}), Error);
}

TEST(Mismatch, RouterDisagreementIsOrderFreePerLayer) {
  // Two tokens (+1 unscored last token), 2 layers, K = 2.
  std::vector<int32_t> a = {0, 1, 2, 3, /*t1*/ 0, 1, 2, 3, /*t2*/ 0, 0, 0, 0};
  std::vector<int32_t> b = {1, 0, 2, 3, /*t1*/ 0, 1, 3, 1, /*t2*/ 9, 9, 9, 9};
  auto d = router_disagreement({a}, {b}, 2, 2);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_DOUBLE_EQ(d[0], 0.0);  // {0,1} vs {1,0} is the same set
  EXPECT_DOUBLE_EQ(d[1], 0.5);  // token 1 differs in layer 1
}

TEST(Mismatch, IndexerDisagreementCountsTokenLayerRowsOrderFree) {
  // Sample 0: 3 tokens (+1 unscored last token), 2 CSA layers, KI = 2.
  std::vector<int32_t> a = {0, 1, 0, -1, /*t1*/ 0, 2, 1, 2, /*t2*/ 0, 1, 0, 1, /*t3*/ 5, 5, 5, 5};
  std::vector<int32_t> b = {1, 0, 0, -1, /*t1*/ 0, 2, 1, -1, /*t2*/ 0, 1, 1, 0, /*t3*/ 0, 0, 0, 0};
  // Sample 1: one token only (nothing scored); sample 2: 2 tokens, one row differs.
  std::vector<int32_t> c = {0, -1, 0, -1}, d = {0, -1, 0, -1};
  std::vector<int32_t> e = {0, 1, 1, 0, /*t1*/ 0, 0, 0, 0}, f = {0, 1, 1, 2, /*t1*/ 1, 1, 1, 1};
  // Rows scored: 3*2 + 0 + 1*2 = 8; differing: (t1, layer 1) and (s2 t0, layer 1).
  EXPECT_DOUBLE_EQ(indexer_disagreement({a, c, e}, {b, d, f}, 2, 2), 2.0 / 8.0);
  EXPECT_DOUBLE_EQ(indexer_disagreement({a}, {a}, 2, 2), 0.0);
  EXPECT_DOUBLE_EQ(indexer_disagreement({}, {}, 2, 2), 0.0);
  EXPECT_THROW(indexer_disagreement({a}, {c}, 2, 2), Error);
  // The JSON has the key only when it was measured (other models' output is unchanged).
  MismatchStats s;
  EXPECT_FALSE(s.to_json().contains("train/indexer_topk_disagreement"));
  s.indexer_disagreement = 0.25;
  EXPECT_EQ(s.to_json()["train/indexer_topk_disagreement"], 0.25);
}

namespace {
ModelConfig tiny_moe() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 256;
  return c;
}

// Dots1-style: sigmoid router with a score-correction bias, which decides the
// selection only (never the gate weights).
ModelConfig tiny_dots1() {
  ModelConfig c = tiny_moe();
  c.architecture = Architecture::Dots1;
  c.num_layers = 3;
  c.num_experts = 4;
  c.router_scoring = RouterScoring::Sigmoid;
  c.score_correction_bias = true;
  c.routed_scaling_factor = 2.5;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 16;
  c.intermediate_size = 40;
  c.first_k_dense_replace = 1;  // layers 1 and 2 are MoE
  return c;
}
}  // namespace

// The trainer must score and differentiate with the replayed experts, not
// its router's. Reference: the same weights with the score-correction bias
// raised on the replayed experts, so that its own routing is the replay with
// unchanged gate weights; logprobs and gradients must have the same bits.
TEST(Replay, TrainerUsesTheReplayedExpertsNotItsRoutersChoice) {
  const ModelConfig c = tiny_dots1();
  ParamLayout layout(c);
  Buffer params = alloc_params(layout), forced = alloc_params(layout);
  init_params(layout, params.as<float>(), 11, 0.3f);
  std::memcpy(forced.data(), params.data(), layout.nbytes());
  const int32_t pair[2][2] = {{1, 2}, {3, 0}};  // per MoE layer, in the raised bias's order
  for (int m = 0; m < 2; ++m) {
    const ParamInfo& p =
        layout.at("model.layers." + std::to_string(m + 1) + ".mlp.gate.e_score_correction_bias");
    forced.as<float>()[p.offset + pair[m][0]] += 100.0f;
    forced.as<float>()[p.offset + pair[m][1]] += 50.0f;
  }
  Trainer a(Context{}, c, std::move(params), {}), b(Context{}, c, std::move(forced), {});
  std::vector<TrainSequence> seqs;
  for (int s = 0; s < 4; ++s) {
    TrainSequence t;
    for (int i = 0; i < 9 + 3 * s; ++i) t.tokens.push_back(int32_t((i * 13 + s * 5 + 2) % c.vocab_size));
    t.prompt_len = 2;
    for (size_t i = 0; i < t.tokens.size(); ++i)
      for (int m = 0; m < 2; ++m) t.routed_experts.insert(t.routed_experts.end(), pair[m], pair[m] + 2);
    seqs.push_back(std::move(t));
  }
  // The replay is b's own routing, and not a's.
  int64_t differ = 0;
  for (const auto& s : seqs) {
    ASSERT_EQ(trainer_routing(Context{}, b.weights(), s.tokens, nullptr), s.routed_experts);
    const auto own = trainer_routing(Context{}, a.weights(), s.tokens, nullptr);
    for (size_t i = 0; i < own.size(); i += 2)
      differ += std::minmax(own[i], own[i + 1]) != std::minmax(s.routed_experts[i], s.routed_experts[i + 1]);
  }
  EXPECT_GT(differ, 20) << "the replay should disagree with a's router";

  LossFn loss = [](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
    double l = 0;
    for (int64_t t = 0; t < n; ++t) {
      l -= double(logp[t]);
      dlogp[t] = -1.0f;
    }
    return l;
  };
  ScoreOptions replay, plain;
  replay.replay = true;
  std::vector<TokenScores> sa, sb;
  EXPECT_EQ(a.accumulate(seqs, loss, replay, &sa), b.accumulate(seqs, loss, plain, &sb));
  for (size_t i = 0; i < seqs.size(); ++i)
    ASSERT_EQ(0, std::memcmp(sa[i].logp.data(), sb[i].logp.data(), sa[i].logp.size() * 4))
        << "sequence " << i;
  ASSERT_EQ(0, std::memcmp(a.grads(), b.grads(), size_t(a.layout().numel()) * 4)) << "gradients differ";
  const auto own = a.score(seqs, plain);
  int64_t changed = 0, n = 0;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t t = 0; t < own[i].logp.size(); ++t, ++n) changed += own[i].logp[t] != sa[i].logp[t];
  EXPECT_GT(changed, n / 2) << "replay should change the logprobs of an un-replayed score";
}

TEST(FastMode, LowPrecisionRolloutHasAGapAndReplayRemovesRouterDisagreement) {
  ModelConfig c = tiny_moe();
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 5, 0.3f);
  Context ctx;
  const int64_t n_moe = 2, K = 2;
  for (DType precision : {DType::BF16, DType::FP8E4M3}) {
    model::ModelWeights fast(ctx, layout, params.as<float>(), precision, 32);
    rollout::EngineConfig ec;
    ec.num_blocks = 256;
    ec.block_size = 4;
    rollout::Engine engine(ctx, &fast, ec);
    std::vector<rollout::Request> reqs;
    for (int i = 0; i < 8; ++i) {
      rollout::Request r;
      for (int j = 0; j < 6 + i; ++j) r.prompt_ids.push_back((i * 7 + j * 3) % 60);
      r.params.n = 4;
      r.params.max_new_tokens = 24;
      r.params.seed = i;
      r.return_experts = true;
      reqs.push_back(r);
    }
    auto out = engine.generate(reqs);
    Buffer copy(layout.nbytes());
    std::memcpy(copy.data(), params.data(), layout.nbytes());
    Trainer trainer(ctx, c, std::move(copy), {});
    for (bool replay : {false, true}) {
      std::vector<TrainSequence> seqs;
      std::vector<std::vector<float>> rl;
      std::vector<std::vector<int32_t>> r_routes, t_routes;
      for (auto& r : out)
        for (auto& s : r.samples) {
          TrainSequence t;
          t.tokens = r.prompt_ids;
          t.tokens.insert(t.tokens.end(), s.output_ids.begin(), s.output_ids.end());
          t.prompt_len = int32_t(r.prompt_ids.size());
          if (replay) t.routed_experts = s.routed_experts;
          rl.push_back(s.logprobs);
          r_routes.push_back(s.routed_experts);
          t_routes.push_back(trainer_routing(ctx, trainer.weights(), t.tokens, replay ? &s.routed_experts : nullptr));
          seqs.push_back(t);
        }
      ScoreOptions so;
      so.replay = replay;
      auto scores = trainer.score(seqs, so);
      std::vector<std::vector<float>> tl;
      for (auto& s : scores) tl.push_back(s.logp);
      MismatchStats m = compute_mismatch(rl, tl);
      auto dis = router_disagreement(r_routes, t_routes, n_moe, K);
      EXPECT_GT(m.abs_diff_mean, 0.0) << dtype_name(precision);
      EXPECT_LT(m.abs_diff_mean, 0.5) << dtype_name(precision);
      double total = 0;
      for (double d : dis) total += d;
      if (replay) {
        EXPECT_EQ(total, 0.0) << dtype_name(precision);
      } else if (precision == DType::FP8E4M3) {
        EXPECT_GT(total, 0.0) << "fp8 rollout should route some tokens differently";
      }
    }
  }
}

// Replay needs one row per token of each record, and a model without CSA
// layers takes no indexer record; the error names the sequence and the sizes.
TEST(Replay, RecordsOfTheWrongSizeAreRefusedByName) {
  const ModelConfig c = tiny_moe();
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 5, 0.3f);
  Trainer t(Context{}, c, std::move(params), {});
  TrainSequence s;
  s.tokens = {1, 2, 3, 4, 5};
  s.prompt_len = 2;
  s.routed_experts = trainer_routing(Context{}, t.weights(), s.tokens, nullptr);
  ScoreOptions replay;
  replay.replay = true;
  EXPECT_NO_THROW(t.score({s}, replay));
  auto message = [&](const TrainSequence& bad) -> std::string {
    try {
      t.score({s, bad}, replay);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TrainSequence short_routes = s;
  short_routes.routed_experts.pop_back();
  const std::string m1 = message(short_routes);
  EXPECT_NE(m1.find("sequence 1: routing replay needs 20 expert ids, got 19"), std::string::npos) << m1;
  TrainSequence with_indexer = s;
  with_indexer.indexer_topk = {0, 1};
  const std::string m2 = message(with_indexer);
  EXPECT_NE(m2.find("sequence 1: indexer replay needs 0 indexer_topk entries"), std::string::npos) << m2;
  EXPECT_NE(m2.find("got 2"), std::string::npos) << m2;
  // Without replay the records are not looked at.
  EXPECT_NO_THROW(t.score({with_indexer, short_routes}, ScoreOptions{}));
}

}  // namespace lockstep::train
