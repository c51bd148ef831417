// Small model shapes the trainer tests share: two layers of width 32, odd
// vocabularies (so no size lines up with a SIMD width or a chunk).
#pragma once

#include "lockstep/model/config.h"

namespace lockstep::test {

// Qwen3-MoE: 4 experts, top-2, V = 97.
inline ModelConfig small_moe() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.num_layers = 2;
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

// Dense Qwen3 with tied embeddings, V = 131.
inline ModelConfig small_tied_dense() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3;
  c.vocab_size = 131;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 40;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 64;
  return c;
}

}  // namespace lockstep::test
