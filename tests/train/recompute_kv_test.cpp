// Recompute on a K/V cache shared by every layer (KvCache::scoring_scratch):
// backward rewrites each layer's keys and values in its recompute, so the
// gradients have exactly the bits of a recompute over a full cache, with
// 1/L of its memory; backward without recompute refuses such a cache.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../common/test_util.h"
#include "lockstep/base/error.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

ModelConfig dense_config() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3;
  c.vocab_size = 83;
  c.hidden_size = 32;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 40;
  c.qk_norm = true;
  c.max_position_embeddings = 64;
  return c;
}

ModelConfig moe_config() {
  ModelConfig c = dense_config();
  c.architecture = Architecture::Qwen3Moe;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 24;
  return c;
}

// Two sequences (16 and 8 tokens) filling three blocks of 8, every row a
// logit row.
model::RaggedBatch two_sequences(const ModelConfig& c) {
  model::RaggedBatch b(2);
  std::vector<int32_t> t0, t1;
  for (int i = 0; i < 16; ++i) t0.push_back(int32_t((i * 7 + 3) % c.vocab_size));
  for (int i = 0; i < 8; ++i) t1.push_back(int32_t((i * 11 + 5) % c.vocab_size));
  const int32_t blocks0[] = {0, 1}, blocks1[] = {2};
  b.add_sequence(t0.data(), 16, 0, blocks0, 2);
  b.add_sequence(t1.data(), 8, 0, blocks1, 1);
  for (int32_t r = 0; r < 24; ++r) b.logit_rows.push_back(r);
  return b;
}

// The parameter gradients of one forward + backward with recompute on `kv`,
// from a fixed dlogits.
std::vector<float> gradients(const ModelConfig& c, const model::ModelWeights& w, model::KvCache& kv,
                             bool recompute) {
  ParamLayout layout(c);
  Buffer g = alloc_params(layout);
  std::memset(g.data(), 0, layout.nbytes());
  const ModelParams grads = bind(layout, g.as<float>());
  const model::RaggedBatch b = two_sequences(c);
  model::Workspace ws;
  model::ForwardOptions o;
  o.save_activations = true;
  o.recompute = recompute;
  model::ForwardResult r;
  model::Activations acts;
  model::forward(Context{}, w, kv, ws, b, o, &r, &acts);
  OwnedTensor dlogits(DType::F32, {24, c.vocab_size});
  float* d = dlogits.view().f32();
  for (int64_t i = 0; i < 24 * c.vocab_size; ++i) d[i] = 0.01f * float((i * 37) % 23) - 0.1f;
  model::backward(Context{}, w, kv, ws, b, acts, dlogits.view(), grads);
  return std::vector<float>(g.as<float>(), g.as<float>() + layout.numel());
}

void check(const ModelConfig& c) {
  ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 17, 0.3f);
  model::ModelWeights w(Context{}, layout, p.as<float>());
  model::KvCache full(c, 3, 8), shared = model::KvCache::scoring_scratch(c, 3, 8);
  ASSERT_TRUE(shared.shared_layers());
  EXPECT_EQ(shared.nbytes() * size_t(c.num_layers), full.nbytes());
  const std::vector<float> want = gradients(c, w, full, false), got_full = gradients(c, w, full, true),
                           got_shared = gradients(c, w, shared, true);
  test::expect_bits_equal(want.data(), got_full.data(), int64_t(want.size()), "recompute, full cache");
  test::expect_bits_equal(want.data(), got_shared.data(), int64_t(want.size()), "recompute, shared cache");
  // The shared array is left holding layer 0's keys: backward rewrote every
  // layer's, down to the first.
  model::KvCache kv0 = model::KvCache::scoring_scratch(c, 3, 8);
  gradients(c, w, kv0, true);
  const int64_t n = int64_t(full.k(0).nbytes() / 4);
  test::expect_bits_equal(full.k(0).f32(), kv0.k(0).f32(), n, "layer 0 keys");
  test::expect_bits_equal(full.v(0).f32(), kv0.v(0).f32(), n, "layer 0 values");
}

TEST(RecomputeKv, DenseSharedCacheGradientsAreBitIdentical) {
  check(dense_config());
}
TEST(RecomputeKv, MoeSharedCacheGradientsAreBitIdentical) {
  check(moe_config());
}

TEST(RecomputeKv, BackwardWithoutRecomputeRefusesASharedCache) {
  const ModelConfig c = dense_config();
  ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 5, 0.3f);
  model::ModelWeights w(Context{}, layout, p.as<float>());
  model::KvCache shared = model::KvCache::scoring_scratch(c, 3, 8);
  EXPECT_THROW(gradients(c, w, shared, false), Error);
}

// A recomputing trainer keeps one layer's K/V, a plain one every layer's;
// both train to the same bits (recompute_test.cpp checks those in detail).
TEST(RecomputeKv, TrainerStepsMatchAcrossPasses) {
  const ModelConfig c = dense_config();
  ParamLayout layout(c);
  Buffer p0 = alloc_params(layout), p1 = alloc_params(layout);
  init_params(layout, p0.as<float>(), 9, 0.2f);
  std::memcpy(p1.as<float>(), p0.as<float>(), layout.nbytes());
  TrainerConfig normal, recompute;
  normal.micro_batch_tokens = recompute.micro_batch_tokens = 16;
  recompute.recompute_activations = true;
  Trainer a(Context{}, c, std::move(p0), normal), b(Context{}, c, std::move(p1), recompute);
  std::vector<TrainSequence> seqs;
  for (int s = 0; s < 3; ++s) {
    TrainSequence t;
    for (int i = 0; i < 9 + 3 * s; ++i) t.tokens.push_back(int32_t((i * 13 + s) % c.vocab_size));
    t.prompt_len = 2;
    seqs.push_back(std::move(t));
  }
  LossFn loss = [](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
    double l = 0;
    for (int64_t t = 0; t < n; ++t) {
      l -= double(logp[t]);
      dlogp[t] = -1.0f;
    }
    return l;
  };
  // Two steps, with a scoring pass between (it shares the recompute's K/V array).
  for (int step = 0; step < 2; ++step) {
    EXPECT_EQ(a.accumulate(seqs, loss, {}), b.accumulate(seqs, loss, {}));
    const auto sa = a.score(seqs, {}), sb = b.score(seqs, {});
    for (size_t i = 0; i < sa.size(); ++i)
      test::expect_bits_equal(sa[i].logp.data(), sb[i].logp.data(), int64_t(sa[i].logp.size()), "logp");
    a.step();
    b.step();
    test::expect_bits_equal(a.params(), b.params(), layout.numel(), "params");
  }
}

}  // namespace
}  // namespace lockstep::train
