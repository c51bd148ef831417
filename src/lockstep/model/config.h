// ModelConfig: the shape and hyper-parameters of a dense or MoE decoder, read
// from a Hugging Face config.json (Llama, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE,
// dots.llm1, DeepSeek-V4) or lockstep's TOML [model] section, and written back
// as config.json.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "lockstep/tensor/dtype.h"

namespace lockstep {

// The Hugging Face model class a config maps to. It decides the config.json
// written and the tensor names of shared experts; the math is the ModelConfig's.
enum class Architecture {
  Llama,     // LlamaForCausalLM: dense, no biases, no q/k norm
  Qwen2,     // Qwen2ForCausalLM: dense, q/k/v bias
  Qwen3,     // Qwen3ForCausalLM: dense, q/k RMSNorm
  Qwen2Moe,  // Qwen2MoeForCausalLM: q/k/v bias, softmax router, one gated shared expert
  Qwen3Moe,  // Qwen3MoeForCausalLM: q/k RMSNorm, softmax router, no shared expert
  Dots1,     // Dots1ForCausalLM: Qwen3 attention + DeepSeek-V3 MoE (sigmoid router,
             // score-correction bias, shared experts, first k layers dense)
  DeepseekV4,  // DeepseekV4ForCausalLM: mHC residual streams, low-rank MQA with a sink,
               // compressed KV (HCA/CSA) with a lightning indexer, hash-routed and
               // sqrtsoftplus MoE, MTP (docs/deepseek-v4.md)
};

const char* architecture_name(Architecture a);        // "Qwen3MoeForCausalLM"
const char* architecture_model_type(Architecture a);  // "qwen3_moe"
// Accepts the class name; throws Error naming it and the supported list.
Architecture parse_architecture(const std::string& name);
std::string supported_architectures();  // "LlamaForCausalLM, Qwen2ForCausalLM, ..."

enum class RouterScoring {
  Softmax,  // p = softmax(logits) over the E experts (Qwen MoE)
  Sigmoid,  // p = sigmoid(logit) per expert (DeepSeek-V3, dots.llm1)
  SqrtSoftplus,  // p = sqrt(softplus(logit)) per expert (DeepSeek-V4)
};
const char* router_scoring_name(RouterScoring s);  // "softmax" | "sigmoid" | "sqrtsoftplus"

// YaRN rope_scaling (DeepSeek-V4 applies it in compressed layers only).
// type "" = none.
struct RopeScaling {
  std::string type;  // "" or "yarn"
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool operator==(const RopeScaling&) const = default;
};

// Dimension letters (docs/architecture.md section 10): V vocab, D width, L layers, H query heads,
// Hkv key/value heads, Dh head width, F dense FFN width, E experts, K top-k,
// Fe expert FFN width, Fs shared-expert FFN width.
// The TOML [model] keys are exactly these field names (docs/model.md).
struct ModelConfig {
  Architecture architecture = Architecture::Qwen3Moe;

  int64_t vocab_size = 0;         // V
  int64_t hidden_size = 0;        // D
  int64_t num_layers = 0;         // L
  int64_t num_heads = 0;          // H
  int64_t num_kv_heads = 0;       // Hkv; H % Hkv == 0 (grouped-query attention)
  int64_t head_dim = 0;           // Dh; may differ from D / H
  int64_t intermediate_size = 0;  // F, width of dense-layer SwiGLU FFNs (0 if no dense layer)
  bool qk_norm = false;           // RMSNorm over Dh on q and k before RoPE (Qwen3)
  bool qkv_bias = false;          // bias on q, k, v projections (Qwen2)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;  // lm_head shares the embedding matrix

  // MoE. num_experts == 0 means every layer is dense.
  int64_t num_experts = 0;            // E
  int64_t num_experts_per_tok = 0;    // K
  int64_t moe_intermediate_size = 0;  // Fe
  RouterScoring router_scoring = RouterScoring::Softmax;
  bool norm_topk_prob = false;         // top-k weights divided by their sum
  double routed_scaling_factor = 1.0;  // multiplies the routed weights (after normalization)
  bool score_correction_bias = false;  // e_score_correction_bias (E), used for selection only
  int64_t n_group = 1;                 // group-limited routing (DeepSeek-V3); 1 = off
  int64_t topk_group = 1;
  int64_t n_shared_experts = 0;                 // 0 = none
  int64_t shared_expert_intermediate_size = 0;  // Fs, total width of the shared-expert FFN
  bool shared_expert_gate = false;              // Qwen2-MoE: output scaled by sigmoid(x · w), w (1, D)
  int64_t first_k_dense_replace = 0;            // layers [0, k) are dense
  int64_t decoder_sparse_step = 1;              // layer i is MoE only if (i + 1) % step == 0
  std::vector<int64_t> mlp_only_layers;         // these layers are dense

  // DeepSeek-V4 only (docs/deepseek-v4.md; 0 / empty for other architectures).
  // Dimension letters: Rq, G, Ro, Dr, W, n, HI, DI, KI.
  int64_t q_lora_rank = 0;                // Rq: low-rank query bottleneck
  int64_t o_groups = 0;                   // G: groups of the low-rank output projection
  int64_t o_lora_rank = 0;                // Ro: rank of each output group
  int64_t qk_rope_head_dim = 0;           // Dr: RoPE on the last Dr dims of every head
  int64_t sliding_window = 0;             // W: causal window (includes the query token)
  std::vector<int64_t> compress_ratios;   // (L + num_nextn_predict_layers): 0, 4 (CSA) or 128 (HCA)
  double compress_rope_theta = 0.0;       // RoPE base where the ratio is > 0
  RopeScaling rope_scaling;               // YaRN, where the ratio is > 0
  int64_t index_n_heads = 0;              // HI
  int64_t index_head_dim = 0;             // DI
  int64_t index_topk = 0;                 // KI: compressed entries kept per query (CSA layers)
  int64_t num_hash_layers = 0;            // layers [0, n) route by tid2eid[token id]
  double swiglu_limit = 0.0;              // SwiGLU clamp (routed and shared experts); 0 = none
  int64_t hc_mult = 0;                    // n: residual streams (mHC)
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  int64_t num_nextn_predict_layers = 0;   // MTP blocks
  std::string expert_dtype;               // checkpoint format of routed experts: "", "fp4", "fp8"

  int64_t bos_token_id = -1;           // -1: none
  std::vector<int64_t> eos_token_ids;  // may be empty

  int64_t q_dim() const { return num_heads * head_dim; }      // H*Dh
  int64_t kv_dim() const { return num_kv_heads * head_dim; }  // Hkv*Dh
  bool is_moe() const { return num_experts > 0; }
  // Whether layer i has a routed MoE FFN (else a dense one of width F).
  bool is_moe_layer(int64_t layer) const;
  // How many layers are MoE (L_moe: the middle dimension of routing tables).
  int64_t num_moe_layers() const;
  bool has_shared_expert() const { return n_shared_experts > 0; }
  bool is_v4() const { return architecture == Architecture::DeepseekV4; }
  // DeepSeek-V4: layer i's compression ratio (0 outside V4), whether it is
  // hash-routed, and the mixing values per token of one mHC site (2n + n*n).
  int64_t compress_ratio(int64_t layer) const {
    return layer < int64_t(compress_ratios.size()) ? compress_ratios[size_t(layer)] : 0;
  }
  bool is_hash_layer(int64_t layer) const { return is_v4() && layer < num_hash_layers; }
  int64_t hc_mix_size() const { return 2 * hc_mult + hc_mult * hc_mult; }

  // Throws Error (prefixed by `source`, e.g. the file) naming the first bad
  // field: non-positive sizes, H % Hkv != 0, K > E, odd Dh, a combination
  // the architecture cannot express in its config.json, a DeepSeek-V4 field
  // outside V4 or out of range in it (docs/deepseek-v4.md, "checked"), ...
  void validate(const std::string& source = "model config") const;

  bool operator==(const ModelConfig&) const = default;
};

// Picks the Hugging Face class able to express `c` (used when the TOML omits
// `architecture`): DeepSeek-V4 if hc_mult > 0 (never otherwise);
// dense → Qwen2 if qkv_bias, Qwen3 if qk_norm, else Llama;
// MoE → Dots1 if sigmoid scoring, score-correction bias or ungated shared
// experts, Qwen2Moe if qkv_bias or a gated shared expert, else Qwen3Moe.
Architecture infer_architecture(const ModelConfig& c);

// Reads a Hugging Face config.json. `source` names the file in errors.
// Unknown architecture, missing required field, unsupported feature (MLA,
// sliding window, rope scaling, non-SiLU activation, o_proj bias) → Error.
// DeepSeek-V4 reads its official keys (docs/deepseek-v4.md), its sliding
// window and YaRN rope_scaling included; quantization_config is ignored.
ModelConfig model_config_from_hf_json(const nlohmann::json& j, const std::string& source);
ModelConfig load_hf_config(const std::string& path);

// The config.json Hugging Face expects for c's architecture; `dtype` fills
// torch_dtype ("float32" or "bfloat16").
nlohmann::json model_config_to_hf_json(const ModelConfig& c, DType dtype);
// Writes config.json atomically (temporary file, then rename).
void save_hf_config(const std::string& path, const ModelConfig& c, DType dtype);

// lockstep's own TOML: reads the [model] section of a config file (other
// sections are left to their owners). Unknown keys in [model] are errors,
// except those listed in `other_keys` (consumed by another parser).
ModelConfig model_config_from_toml_file(const std::string& path,
                                        const std::vector<std::string>& other_keys = {});
ModelConfig model_config_from_toml_string(const std::string& text, const std::string& source,
                                          const std::vector<std::string>& other_keys = {});
// The [model] section (header included) that reads back as c.
std::string model_config_to_toml(const ModelConfig& c);

}  // namespace lockstep
