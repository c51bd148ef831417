// LoRA adapters in Hugging Face PEFT's file format: adapter_config.json (the
// LoraSpec), the adapted projections of a model and their PEFT tensor names
// (LoraLayout: A and B of each, as views into one flat f32 buffer), the
// adapter_model.safetensors reader and writer, and the merge W + s·B·A that
// `lockstep export --merge-lora` writes (docs/lora.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/params.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep {

// The files of an adapter directory, as PEFT names them.
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

// The projections LoRA can adapt, by PEFT's module names, in layer order:
// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj".
// "gate_proj", "up_proj" and "down_proj" cover the dense MLP, every routed
// expert and the shared expert(s) of an MoE layer alike (PEFT matches module
// names by their last component). The MoE router (mlp.gate), the shared
// expert gate, the embeddings and the LM head are never adapted.
const std::vector<std::string>& lora_module_names();
// DeepSeek-V4's adaptable projections, by the last component of its own
// tensor names: "wq_a", "wkv", "wq_b", "wo_b" (attention) and "w1", "w3",
// "w2" (gate, up, down of every routed and shared expert). The grouped
// wo_a (not one linear map of its input), the router (ffn.gate), the
// compressors, the indexer and the MTP blocks are never adapted; on V4,
// "all-linear" (read as lora_module_names()) means these seven.
const std::vector<std::string>& lora_v4_module_names();

// A user's target list as LoraSpec holds it: the names in lora_module_names()
// order, each once; "all-linear" anywhere in the list gives all seven. Error
// for an empty list or a name lockstep cannot adapt ("lm_head", a pattern, ...).
std::vector<std::string> lora_target_modules(const std::vector<std::string>& names);

// What adapter_config.json says, restricted to what lockstep honours: plain
// LoRA (no rsLoRA, DoRA, biases, per-module ranks, modules_to_save).
struct LoraSpec {
  int64_t rank = 8;      // r
  double alpha = 16.0;   // lora_alpha; the update is scale() · B · A
  double dropout = 0.0;  // lora_dropout, in [0, 1): training only
  // PEFT module names from lora_module_names(), in that order, no repeats
  // (lora_target_modules makes such a list from any list).
  // The JSON may say "all-linear" (a string, as PEFT writes it); it reads as
  // all seven names, and lockstep writes the list.
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  std::string base_model_name_or_path;  // may be empty (written as null)

  double scale() const { return alpha / static_cast<double>(rank); }
  bool targets(const std::string& module) const;
  // Error naming the field for rank < 1, a non-finite or zero alpha, dropout
  // outside [0, 1), an empty, unknown or repeated target module.
  void validate() const;
};

// adapter_config.json as PEFT writes it: "peft_type": "LORA", "task_type":
// "CAUSAL_LM", "r", "lora_alpha", "lora_dropout", "target_modules" (a list),
// "bias": "none", "base_model_name_or_path", "fan_in_fan_out": false,
// "use_rslora": false, "use_dora": false, "modules_to_save": null,
// "inference_mode": true, "rank_pattern": {}, "alpha_pattern": {}.
std::string adapter_config_json(const LoraSpec& spec);
// Parses an adapter_config.json text; `source` (the file) prefixes every
// error, which names the key. Refused: peft_type other than "LORA", task_type
// other than "CAUSAL_LM" or null, use_rslora, use_dora, fan_in_fan_out,
// lora_bias or use_qalora true, bias other than "none", non-empty
// modules_to_save, rank_pattern, alpha_pattern, layers_to_transform,
// exclude_modules, target_parameters, layer_replication,
// trainable_token_indices, alora_invocation_tokens or arrow_config, a target
// module lockstep cannot adapt, and any other key not at null, false or
// empty (a feature lockstep does not know, switched on).
// Keys that only say how PEFT initialised or ran the adapter
// (init_lora_weights, loftq_config, revision, inference_mode, ...) are read
// and ignored.
LoraSpec parse_adapter_config(const std::string& json_text, const std::string& source);
// dir/adapter_config.json, written atomically / read (Error naming the file).
void write_adapter_config(const std::string& dir, const LoraSpec& spec);
LoraSpec read_adapter_config(const std::string& dir);

// One adapted projection W (out_features, in_features) of a model: its low-rank
// update B · A with A (r, in_features) and B (out_features, r), both row-major
// in the adapter's flat buffer.
struct LoraProjection {
  std::string module;        // PEFT module name: "q_proj", ..., "down_proj"
  std::string base_name;     // the model's tensor: "model.layers.0.self_attn.q_proj.weight"
  std::string a_name;        // "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
  std::string b_name;        // "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
  int64_t layer = -1;        // decoder layer
  int64_t expert = -1;       // routed expert, or -1
  int64_t in_features = 0;   // W's columns
  int64_t out_features = 0;  // W's rows
  int64_t a_offset = 0;      // in floats from the adapter buffer's start: A, (r, in_features)
  int64_t b_offset = 0;      // B, (out_features, r), right after A
};

// The adapter of a spec on a model: one LoraProjection per adapted weight,
// in the model's ParamLayout order (so layer by layer; a MoE layer's experts
// as the layout holds them), packed A then B, back to back, in one f32
// buffer of numel() floats. The tensor names are the model's Hugging Face
// names with PEFT's "base_model.model." prefix and ".weight" replaced by
// ".lora_A.weight" / ".lora_B.weight". A layout of some experts only (expert
// parallelism) adapts the experts it holds. On DeepSeek-V4 the targets are
// lora_v4_module_names() of the main layers (the spec's target_modules
// become V4's seven when they are lora_module_names(), i.e. "all-linear");
// error for a dense name on V4 or a V4 name on another model.
class LoraLayout {
 public:
  LoraLayout() = default;
  LoraLayout(const ParamLayout& model, const LoraSpec& spec);

  const LoraSpec& spec() const { return spec_; }
  int64_t rank() const { return spec_.rank; }
  const std::vector<LoraProjection>& projections() const { return projections_; }
  int64_t numel() const { return numel_; }
  const LoraProjection* find_base(const std::string& base_name) const;  // nullptr if not adapted

 private:
  LoraSpec spec_;
  std::vector<LoraProjection> projections_;
  int64_t numel_ = 0;
};

// PEFT's usual initialisation, for adapters lockstep starts: A ~ uniform
// Kaiming (bound 1/sqrt(in_features)), a pure function of (seed, tensor name,
// element) like init_params; B = 0, so the adapted model starts as the base.
void init_lora(const LoraLayout& lora, float* base, uint64_t seed);

// dir/adapter_model.safetensors from the flat buffer: every A and B under its
// PEFT name and shape, as F32 or BF16 (round to nearest even), written
// atomically (write_safetensors). dir must exist.
void write_adapter_weights(const std::string& dir, const LoraLayout& lora, const float* base,
                           DType dtype = DType::F32);
// Fills base[0, lora.numel()) from dir/adapter_model.safetensors (or from a
// path to a .safetensors file). Each tensor may be F32, BF16 or F16 (widened
// exactly). Errors, each naming the file and the tensor: an expected tensor
// missing; a shape other than (r, in_features) / (out_features, r); another
// dtype; a tensor the layout does not expect (an adapter of another model or
// target set); plus every file-level check of SafetensorsFile.
void read_adapter_weights(const std::string& dir, const LoraLayout& lora, float* base);

// An adapter directory: adapter_config.json and adapter_model.safetensors.
struct LoraAdapter {
  LoraLayout layout;
  std::vector<float> params;  // layout.numel()
};
// Writes both files into dir (created if absent).
void save_adapter(const std::string& dir, const LoraLayout& lora, const float* base,
                  DType dtype = DType::F32);
// Reads both files of dir for `model`; Errors as read_adapter_config and
// read_adapter_weights.
LoraAdapter load_adapter(const std::string& dir, const ParamLayout& model);

// W += s · B · A for every projection of `lora`, s = alpha / r, in the flat
// model buffer `model_base` (a buffer of lora's ParamLayout). The order, per
// element (o, i):
//   acc   = Σ_{k = 0..r-1} double(B[o,k]) · double(A[k,i])    (k in order)
//   W'    = float(double(W[o,i]) + s · acc)                   (one rounding)
// and W is left as it is where s · acc == 0 (so B = 0 gives back the base
// bit for bit, -0.0 included). ctx (may be null) spreads rows over threads;
// the result does not depend on the thread count.
void merge_lora(const LoraLayout& lora, const float* lora_base, const ParamLayout& model, float* model_base,
                const Context* ctx = nullptr);

}  // namespace lockstep
