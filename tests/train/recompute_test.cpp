// Activation recompute (TrainerConfig::recompute_activations): the forward
// keeps only each layer's input, backward recomputes the rest layer by layer;
// gradients and losses must have exactly the bits of the normal path, dense
// and MoE, with routing replay too.
#include <gtest/gtest.h>

#include <cstring>

#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/train/mismatch.h"
#include "lockstep/train/trainer.h"
#include "../common/test_util.h"

namespace lockstep::train {
namespace {

ModelConfig moe_config() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 89;
  c.hidden_size = 32;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 24;
  c.max_position_embeddings = 64;
  return c;
}

ModelConfig dense_config() {
  ModelConfig c;
  c.architecture = Architecture::Qwen2;
  c.vocab_size = 83;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 4;
  c.head_dim = 8;
  c.intermediate_size = 40;
  c.qkv_bias = true;
  c.max_position_embeddings = 64;
  return c;
}

std::vector<TrainSequence> sequences(const ModelConfig& c) {
  std::vector<TrainSequence> out;
  for (int s = 0; s < 5; ++s) {
    TrainSequence t;
    for (int i = 0; i < 7 + 4 * s; ++i) t.tokens.push_back(int32_t((i * 31 + s * 7 + 1) % c.vocab_size));
    t.prompt_len = 1 + s;
    out.push_back(std::move(t));
  }
  return out;
}

// Gradient of a weighted logprob + entropy loss with and without recompute.
void check(const ModelConfig& c, bool replay) {
  ParamLayout layout(c);
  Buffer p0 = alloc_params(layout), p1 = alloc_params(layout);
  init_params(layout, p0.as<float>(), 13, 0.2f);
  std::memcpy(p1.as<float>(), p0.as<float>(), layout.nbytes());
  TrainerConfig normal, recompute;
  normal.micro_batch_tokens = recompute.micro_batch_tokens = 24;  // several micro-batches
  recompute.recompute_activations = true;
  Trainer a(Context{}, c, std::move(p0), normal), b(Context{}, c, std::move(p1), recompute);
  auto seqs = sequences(c);
  if (replay)
    for (auto& s : seqs) {
      // Experts the router would not choose (each of its own shifted by one),
      // so that a recompute which routed afresh would give other bits.
      s.routed_experts = trainer_routing(Context{}, a.weights(), s.tokens, nullptr);
      for (auto& e : s.routed_experts) e = int32_t((e + 1) % c.num_experts);
    }
  LossFn loss = [](size_t i, const float* logp, const float* ent, int64_t n, float* dlogp, float* dent) {
    double l = 0;
    for (int64_t t = 0; t < n; ++t) {
      const float w = 0.1f * float(int64_t(i) + t % 3 + 1);
      l -= double(w) * double(logp[t]) + 0.01 * double(ent[t]);
      dlogp[t] = -w;
      dent[t] = -0.01f;
    }
    return l;
  };
  ScoreOptions so;
  so.entropy = true;
  so.replay = replay;
  so.temperature = 0.9f;
  std::vector<TokenScores> sa, sb;
  const double la = a.accumulate(seqs, loss, so, &sa), lb = b.accumulate(seqs, loss, so, &sb);
  EXPECT_EQ(la, lb);
  test::expect_bits_equal(a.grads(), b.grads(), a.layout().numel(), "gradients");
  for (size_t i = 0; i < sa.size(); ++i)
    test::expect_bits_equal(sa[i].logp.data(), sb[i].logp.data(), int64_t(sa[i].logp.size()), "logp");
  if (replay) {  // and the replay is used at all
    ScoreOptions plain = so;
    plain.replay = false;
    const auto own = a.score(seqs, plain);
    int64_t changed = 0, n = 0;
    for (size_t i = 0; i < sa.size(); ++i)
      for (size_t t = 0; t < sa[i].logp.size(); ++t, ++n) changed += sa[i].logp[t] != own[i].logp[t];
    EXPECT_GT(changed, n / 2) << "replayed experts should change the logprobs";
  }
  // And the next step (optimizer, repack) stays identical.
  a.step();
  b.step();
  test::expect_bits_equal(a.params(), b.params(), a.layout().numel(), "params after a step");
}

TEST(Recompute, MoeGradientsAreBitIdentical) { check(moe_config(), false); }
TEST(Recompute, MoeWithRoutingReplayGradientsAreBitIdentical) { check(moe_config(), true); }
TEST(Recompute, DenseGradientsAreBitIdentical) { check(dense_config(), false); }

TEST(Recompute, ForwardKeepsOnlyTheLayerInputs) {
  const ModelConfig c = moe_config();
  ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 3, 0.2f);
  model::ModelWeights w(Context{}, layout, p.as<float>());
  model::KvCache kv(c, 8, 16);
  model::Workspace ws;
  model::RaggedBatch b;
  for (int i = 0; i < 12; ++i) b.tokens.push_back(int32_t(i * 5 % c.vocab_size));
  b.n_ctx = {0};
  b.n_new = {12};
  b.block_table = {0};
  b.max_blocks = 1;
  for (int i = 0; i < 12; ++i) b.logit_rows.push_back(i);
  model::ForwardOptions o;
  o.save_activations = true;
  o.recompute = true;
  model::ForwardResult r;
  model::Activations acts;
  model::forward(Context{}, w, kv, ws, b, o, &r, &acts);
  ASSERT_EQ(acts.layers.size(), size_t(c.num_layers));
  EXPECT_TRUE(acts.recompute);
  // Every layer keeps its input; only the last one also holds the buffers
  // (for backward, which starts there).
  for (size_t i = 0; i < acts.layers.size(); ++i) {
    const auto& l = acts.layers[i];
    EXPECT_EQ(l.x_in.view().dim(0), 12);
    const bool last = i + 1 == acts.layers.size();
    EXPECT_EQ(l.q.view().data != nullptr, last) << "layer " << i;
    EXPECT_EQ(l.xe.view().data != nullptr, last) << "layer " << i;
  }
}

}  // namespace
}  // namespace lockstep::train
