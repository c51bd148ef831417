// save -> load -> forward: a model written in Hugging Face layout (config.json +
// safetensors, f32) and read back gives the trainer bit-identical logprobs,
// for a dense and a MoE model whose config departs from every default that
// config.json must carry (rope theta, norm eps, qk-norm, qkv bias, tied
// embeddings, router settings).
#include <gtest/gtest.h>

#include <cstring>

#include "lockstep/model/params.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/train/trainer.h"
#include "../common/test_util.h"
#include "../model/model_test_util.h"

namespace lockstep::train {
namespace {

std::vector<TrainSequence> sequences(int64_t vocab) {
  std::vector<TrainSequence> out;
  for (int s = 0; s < 4; ++s) {
    TrainSequence t;
    for (int i = 0; i < 9 + 5 * s; ++i) t.tokens.push_back(int32_t((i * 37 + s * 11 + 3) % vocab));
    t.prompt_len = 2 + s;
    out.push_back(std::move(t));
  }
  return out;
}

void check_round_trip(const ModelConfig& cfg, const std::string& tag) {
  test::TempDir dir(tag);
  ParamLayout layout(cfg);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 21, 0.2f);
  save_pretrained(dir.str("m"), cfg, layout, p.as<float>());
  const auto seqs = sequences(cfg.vocab_size);
  ScoreOptions so;
  so.temperature = 0.7f;
  so.entropy = true;
  Trainer a(Context{}, cfg, std::move(p), TrainerConfig{});
  const auto want = a.score(seqs, so);

  PretrainedModel m = load_pretrained(dir.str("m"));
  Trainer b(Context{}, m.config, std::move(m.params), TrainerConfig{});
  const auto got = b.score(seqs, so);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].logp.size(), got[i].logp.size());
    test::expect_bits_equal(want[i].logp.data(), got[i].logp.data(), int64_t(want[i].logp.size()), "logp");
    test::expect_bits_equal(want[i].entropy.data(), got[i].entropy.data(), int64_t(want[i].entropy.size()),
                            "entropy");
  }
}

TEST(SaveLoadForward, DenseQwen2WithBiasAndTiedEmbeddings) {
  ModelConfig c;
  c.architecture = Architecture::Qwen2;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 40;
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  c.rope_theta = 12345.0;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 64;
  check_round_trip(c, "slf-dense");
}

TEST(SaveLoadForward, Qwen3MoeWithOneKvHeadAndUnnormalisedTopK) {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 101;
  c.hidden_size = 32;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 16;
  c.qk_norm = true;
  c.num_experts = 6;
  c.num_experts_per_tok = 3;
  c.moe_intermediate_size = 24;
  c.norm_topk_prob = false;
  c.rope_theta = 500000.0;
  c.max_position_embeddings = 64;
  check_round_trip(c, "slf-moe");
}

}  // namespace
}  // namespace lockstep::train
