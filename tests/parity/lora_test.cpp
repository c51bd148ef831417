// The parity suite with LoRA adapters on: a LoRA trainer takes a few AdamW
// steps (so B is non-zero), the rollout engine generates on the trainer's
// weights (which carry the adapters) under several scheduler settings, and
// every sampled token's logprob equals the trainer's rescoring bit for bit,
// on a dense and a Qwen3-MoE model, with the base at f32, bf16 and fp8.
#include <gtest/gtest.h>

#include <cmath>

#include "parity/parity_util.h"

namespace lockstep::parity {
namespace {

ModelConfig dense_model() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3;
  c.vocab_size = 53;
  c.hidden_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 6;
  c.intermediate_size = 20;
  c.qk_norm = true;
  c.max_position_embeddings = 128;
  return c;
}

ModelConfig qwen3_moe_model() {
  ModelConfig c = dense_model();
  c.architecture = Architecture::Qwen3Moe;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {0};
  return c;
}

// Prompts and sampling settings of a random case, on `config`.
Case case_on(const ModelConfig& config, uint64_t seed) {
  Case cs = random_case(seed);
  cs.config = config;
  for (Request& r : cs.requests)
    for (int32_t& t : r.prompt_ids) t = t % int32_t(config.vocab_size);
  return cs;
}

train::TrainerConfig lora_trainer_config(DType precision) {
  train::TrainerConfig tc;
  tc.micro_batch_tokens = 64;
  tc.logits_chunk = 0;
  tc.kv_block_size = 4;
  tc.precision = precision;
  tc.fp8_block = 16;
  tc.optim.lr = 5e-2;  // large: a few steps move B well away from 0
  tc.lora.rank = 4;
  tc.lora.alpha = 8;
  tc.lora.target_modules = {"all-linear"};
  tc.lora.init_seed = 9;
  return tc;
}

// Three steps of raising the logprob of a few random sequences.
void train_a_little(train::Trainer& t, int64_t V) {
  std::mt19937 g(4);
  for (int step = 0; step < 3; ++step) {
    std::vector<train::TrainSequence> seqs(3);
    for (auto& s : seqs) {
      for (int j = 0; j < 10; ++j) s.tokens.push_back(int32_t(g() % uint32_t(V)));
      s.prompt_len = 3;
    }
    const train::LossFn loss = [](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
      double l = 0;
      for (int64_t i = 0; i < n; ++i) {
        l -= logp[i];
        dlogp[i] = -1.0f;
      }
      return l;
    };
    t.accumulate(seqs, loss, {});
    t.step();
  }
}

void check_lora_parity(const ModelConfig& config, DType precision, uint64_t seed) {
  Model m(config, seed);
  Buffer copy(m.layout.nbytes());
  std::memcpy(copy.data(), m.params.data(), m.layout.nbytes());
  train::Trainer t(Context{}, config, std::move(copy), lora_trainer_config(precision));
  ASSERT_NE(t.lora(), nullptr);
  train_a_little(t, config.vocab_size);
  EXPECT_EQ(t.version(), 3u);
  // B moved away from its zero start, and the base did not move.
  double b_abs = 0;
  const float* lp = t.lora()->params();
  for (const LoraProjection& p : t.lora()->layout().projections())
    for (int64_t j = 0; j < p.out_features * 4; ++j) b_abs += std::fabs(lp[p.b_offset + j]);
  EXPECT_GT(b_abs, 0.0);
  EXPECT_EQ(std::memcmp(t.params(), m.params.data(), m.layout.nbytes()), 0);

  const Case cs = case_on(config, seed);
  ThreadPool pool2(2);
  std::mt19937_64 g(seed);
  std::vector<RequestResult> baseline;
  for (const Variation& v : variations_for(cs, g)) {
    const auto results = run_engine(t.weights(), cs, v, &pool2);
    if (baseline.empty()) {
      baseline = results;
    } else {
      EXPECT_EQ(first_output_difference(baseline, results), "") << v.name;
    }
  }
  // The trainer rescoring the samples (same temperatures as the engine).
  std::vector<train::TrainSequence> seqs;
  std::vector<float> temps;
  for (size_t i = 0; i < baseline.size(); ++i)
    for (const auto& s : baseline[i].samples) {
      train::TrainSequence ts;
      ts.tokens = baseline[i].prompt_ids;
      ts.tokens.insert(ts.tokens.end(), s.output_ids.begin(), s.output_ids.end());
      ts.prompt_len = int32_t(baseline[i].prompt_ids.size());
      seqs.push_back(std::move(ts));
      temps.push_back(cs.requests[i].params.logprob_temperature());
    }
  std::vector<std::vector<float>> scored(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    train::ScoreOptions so;
    so.temperature = temps[i];
    scored[i] = t.score({seqs[i]}, so)[0].logp;
  }
  const Gap gap = logprob_gap(baseline, scored);
  EXPECT_GT(gap.tokens, 10);
  EXPECT_EQ(gap.differing, 0) << gap.first_bad;
  EXPECT_EQ(gap.max_abs, 0.0);

  // Without the adapters the engine's logprobs are other numbers: the
  // adapters were in the products compared above.
  model::ModelWeights plain(Context{}, t.layout(), t.params(), t.weights().storage(),
                            t.weights().fp8_block());
  double moved = 0;
  const auto base_results = run_engine(plain, cs, variations_for(cs, g)[0], &pool2);
  for (size_t i = 0; i < base_results.size(); ++i)
    if (!base_results[i].samples.empty() && !baseline[i].samples.empty() &&
        !base_results[i].samples[0].logprobs.empty() && !baseline[i].samples[0].logprobs.empty())
      moved += std::fabs(double(base_results[i].samples[0].logprobs[0]) - baseline[i].samples[0].logprobs[0]);
  EXPECT_GT(moved, 0.0);
}

TEST(LoraParity, DenseF32) {
  check_lora_parity(dense_model(), DType::F32, 31);
}
TEST(LoraParity, DenseBf16) {
  check_lora_parity(dense_model(), DType::BF16, 32);
}
TEST(LoraParity, DenseFp8) {
  check_lora_parity(dense_model(), DType::FP8E4M3, 33);
}
TEST(LoraParity, Qwen3MoeF32) {
  check_lora_parity(qwen3_moe_model(), DType::F32, 34);
}
TEST(LoraParity, Qwen3MoeBf16) {
  check_lora_parity(qwen3_moe_model(), DType::BF16, 35);
}
TEST(LoraParity, Qwen3MoeFp8) {
  check_lora_parity(qwen3_moe_model(), DType::FP8E4M3, 36);
}

}  // namespace
}  // namespace lockstep::parity
