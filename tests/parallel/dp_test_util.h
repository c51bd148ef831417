// A tiny random MoE model and a random SFT batch for the data-parallel tests.
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"

namespace lockstep::test {

inline ModelConfig dp_tiny_moe() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 32;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 128;
  return c;
}

// n sequences of 5..16 random tokens, prompts of 1..3 tokens.
inline std::vector<train::TrainSequence> dp_batch(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<train::TrainSequence> out(static_cast<size_t>(n));
  for (auto& s : out) {
    const int len = 5 + int(g() % 12);
    for (int i = 0; i < len; ++i) s.tokens.push_back(int32_t(g() % 32));
    s.prompt_len = 1 + int32_t(g() % 3);
  }
  return out;
}

inline std::unique_ptr<train::Trainer> dp_trainer(const Context& ctx, bool world_invariant = false) {
  const ModelConfig c = dp_tiny_moe();
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 1234, 0.1f);
  train::TrainerConfig tc;
  tc.optim.lr = 1e-3;
  tc.optim.weight_decay = 0.01;
  tc.optim.grad_clip = 1.0;
  tc.micro_batch_tokens = 24;  // several micro-batches per shard
  tc.world_invariant = world_invariant;
  return std::make_unique<train::Trainer>(ctx, c, std::move(params), tc);
}

}  // namespace lockstep::test
