// The toy DeepSeek-V4 config the model, rollout and trainer tests share.
#pragma once

#include "lockstep/model/config.h"

namespace lockstep::test {

// Every V4 part at toy width: layer 0 hash-routed and window-only, layers 1
// and 3 CSA (ratio 4, indexer), layer 2 HCA (ratio 128).
inline ModelConfig tiny_v4() {
  ModelConfig c;
  c.architecture = Architecture::DeepseekV4;
  c.vocab_size = 48;
  c.hidden_size = 16;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.q_lora_rank = 8;
  c.o_groups = 2;
  c.o_lora_rank = 6;
  c.sliding_window = 5;
  c.compress_ratios = {0, 4, 128, 4};
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.rope_scaling = {"yarn", 4.0, 64, 32.0, 1.0};
  c.max_position_embeddings = 512;
  c.index_n_heads = 2;
  c.index_head_dim = 6;
  c.index_topk = 3;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 8;
  c.router_scoring = RouterScoring::SqrtSoftplus;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 1.5;
  c.score_correction_bias = true;
  c.num_hash_layers = 1;
  c.swiglu_limit = 3.0;  // clamps a few rows; finite differences rarely straddle it
  c.hc_mult = 2;
  c.hc_sinkhorn_iters = 4;
  c.hc_eps = 1e-6;
  c.rms_norm_eps = 1e-6;
  c.bos_token_id = 0;
  c.eos_token_ids = {1};
  return c;
}

}  // namespace lockstep::test
