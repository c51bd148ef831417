// The TOML [model] section <-> ModelConfig, for callers that already hold a
// parsed toml++ table (the CLI's config loader). Kept apart from config.h so
// that only these callers pay for the toml++ header.
#pragma once

#include <toml++/toml.h>

#include <string>
#include <vector>

#include "lockstep/model/config.h"

namespace lockstep {

// `model` is the [model] table; `source` names the file in errors ("run.toml").
// Keys are the ModelConfig field names (docs/model.md). Required: vocab_size,
// hidden_size, num_layers, num_heads (+ intermediate_size when a layer is
// dense, num_experts_per_tok and moe_intermediate_size when num_experts > 0).
// Defaults: num_kv_heads = num_heads, head_dim = hidden_size / num_heads,
// shared_expert_intermediate_size = n_shared_experts * moe_intermediate_size,
// architecture inferred (infer_architecture). DeepSeek-V4 (architecture
// "DeepseekV4ForCausalLM", or inferred from hc_mult > 0) adds the keys of
// docs/deepseek-v4.md: compress_ratios an integer array, rope_scaling an
// inline table {type, factor, original_max_position_embeddings, beta_fast,
// beta_slow}, expert_dtype a string, the rest scalars; its defaults are
// num_kv_heads = 1, n_shared_experts = 1, score_correction_bias = true,
// router_scoring = "sqrtsoftplus". Unknown key, wrong type or an
// invalid value → Error naming the source and the key.
ModelConfig model_config_from_toml(const toml::table& model, const std::string& source,
                                   const std::vector<std::string>& other_keys = {});

}  // namespace lockstep
