// TrainerConfig::in_place_weights: the f32 forward reads the projections from
// the master where they are instead of from a packed copy. Losses, token
// log-probs and the weights after several AdamW steps must have exactly the
// bits of the packed trainer (dense with biases and tied embeddings, MoE with a
// shared expert, DeepSeek-V4), on one and two threads, with no packed bytes
// held; bf16 ignores the option (its packed bytes are the quantized weights).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../common/test_util.h"
#include "../common/v4_config.h"
#include "lockstep/model/packed_checksum.h"
#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

ModelConfig dense_tied() {
  ModelConfig c;
  c.architecture = Architecture::Qwen2;
  c.vocab_size = 83;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 40;
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 64;
  return c;
}

ModelConfig moe_shared() {
  ModelConfig c;
  c.architecture = Architecture::Qwen2Moe;
  c.vocab_size = 89;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 24;
  c.qkv_bias = true;
  c.n_shared_experts = 1;
  c.shared_expert_gate = true;
  c.shared_expert_intermediate_size = 16;
  c.max_position_embeddings = 64;
  return c;
}

std::vector<TrainSequence> sequences(const ModelConfig& c) {
  std::vector<TrainSequence> out;
  for (int s = 0; s < 5; ++s) {
    TrainSequence t;
    for (int i = 0; i < 9 + 5 * s; ++i) t.tokens.push_back(int32_t((i * 37 + s * 11 + 3) % c.vocab_size));
    t.prompt_len = 1 + s;
    out.push_back(std::move(t));
  }
  return out;
}

// Three steps of a packed and an in-place trainer from the same weights.
void check(const ModelConfig& c, DType precision, int threads) {
  SCOPED_TRACE(std::string(architecture_name(c.architecture)) + " " + dtype_name(precision) + " threads " +
               std::to_string(threads));
  ThreadPool pool(threads);
  const Context ctx{&pool};
  ParamLayout layout(c);
  Buffer p0 = alloc_params(layout), p1 = alloc_params(layout);
  init_params(layout, p0.as<float>(), 17, 0.2f);
  std::memcpy(p1.as<float>(), p0.as<float>(), layout.nbytes());
  TrainerConfig packed, in_place;
  packed.micro_batch_tokens = in_place.micro_batch_tokens = 30;  // several micro-batches
  packed.precision = in_place.precision = precision;
  packed.optim.lr = in_place.optim.lr = 1e-2;
  in_place.in_place_weights = true;
  Trainer a(ctx, c, std::move(p0), packed), b(ctx, c, std::move(p1), in_place);
  const bool f32 = precision == DType::F32;
  EXPECT_EQ(b.weights().in_place(), f32);
  EXPECT_EQ(model::packed_bytes(b.weights()), f32 ? 0u : model::packed_bytes(a.weights()));
  EXPECT_GT(model::packed_bytes(a.weights()), 0u);

  const auto seqs = sequences(c);
  LossFn loss = [](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
    double l = 0;
    for (int64_t i = 0; i < n; ++i) {
      l -= logp[i] * 0.05;
      dlogp[i] = -0.05f;
    }
    return l;
  };
  for (int step = 0; step < 3; ++step) {
    const double la = a.accumulate(seqs, loss, ScoreOptions{});
    const double lb = b.accumulate(seqs, loss, ScoreOptions{});
    EXPECT_EQ(std::memcmp(&la, &lb, sizeof la), 0) << "step " << step << ": loss " << la << " vs " << lb;
    a.step();
    b.step();
    EXPECT_EQ(std::memcmp(a.params(), b.params(), layout.nbytes()), 0)
        << "weights differ after step " << step;
  }
  const auto sa = a.score(seqs, ScoreOptions{}), sb = b.score(seqs, ScoreOptions{});
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    test::expect_bits_equal(sb[i].logp.data(), sa[i].logp.data(), int64_t(sa[i].logp.size()),
                            "token log-probs after the steps");
}

TEST(InPlaceWeights, TrainsToTheBitsOfThePackedTrainer) {
  for (int threads : {1, 2}) {
    check(dense_tied(), DType::F32, threads);
    check(moe_shared(), DType::F32, threads);
    check(test::tiny_v4(), DType::F32, threads);
  }
}

TEST(InPlaceWeights, IgnoredAtBf16) {
  check(moe_shared(), DType::BF16, 2);
}

}  // namespace
}  // namespace lockstep::train
