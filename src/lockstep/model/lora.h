// LoRA adapters (PEFT's low-rank update) on the packed projections: y = x·Wᵀ
// + s·(x·Aᵀ)·Bᵀ with A (r, in), B (out, r) f32 and s = alpha / r. The base W
// stays frozen at its storage precision; the adapters live in one flat f32
// buffer of their own (LoraLayout, peft.h: PEFT's names and order), so the optimizer, weight sync and
// checkpoints work on that range alone. ModelWeights carries a LoraWeights,
// so the rollout engine and the trainer apply the same adapters in the same
// order by construction (docs/kernels.md, "LoRA").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/model/params.h"
#include "lockstep/model/peft.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::model {

// The [lora] section. rank 0 (or no section): full fine-tuning.
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 16;  // scale s = alpha / rank (PEFT's rule)
  // PEFT module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
  // down_proj; DeepSeek-V4: wq_a, wkv, wq_b, wo_b, w1, w3, w2), or the one
  // entry "all-linear" (all seven of the model's family).
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  uint64_t init_seed = 0;  // A's kaiming-uniform draw
  bool enabled() const { return rank > 0; }
  float scale() const { return rank > 0 ? static_cast<float>(alpha / double(rank)) : 0.0f; }
  // The target list with "all-linear" spelled out, in the canonical order.
  std::vector<std::string> modules() const;
  // As adapter_config.json says it (peft.h); base: base_model_name_or_path.
  LoraSpec spec(const std::string& base = "") const;
};

// Reads [lora]: rank, alpha, dropout (only 0), target_modules, init_seed.
// Throws Error naming the file and key for a bad value.
LoraConfig lora_config_from_toml(TomlSection& s);
// The [lora] section of a config file's root (absent: rank 0, LoRA off),
// every key checked (unknown keys are errors).
LoraConfig lora_config_from_root(const toml::table& root, const std::string& source);

// One adapted projection: A (r, in), B (out, r). Empty tensors: not adapted.
struct LoraPair {
  Tensor a;
  Tensor b;
  bool on() const { return a.data != nullptr; }
};

struct LoraMlp {
  LoraPair gate, up, down;
};

struct LoraLayer {
  LoraPair q, k, v, o;
  LoraPair wq_a, wkv, wq_b, wo_b;  // DeepSeek-V4's attention
  LoraMlp mlp;                     // dense layers
  std::vector<LoraMlp> experts;    // (E) MoE layers' routed experts (V4: w1, w3, w2 as gate, up, down)
  LoraMlp shared;                  // the shared expert(s), if any
};

// Routed expert e's adapters in layer l (null: no layer, or no MLP target).
inline const LoraMlp* lora_expert(const LoraLayer* l, int64_t e) {
  return l != nullptr && size_t(e) < l->experts.size() ? &l->experts[size_t(e)] : nullptr;
}

// Typed views over a flat LoRA buffer (parameters, gradients or moments).
struct LoraParams {
  std::vector<LoraLayer> layers;
};

// Views of the adapters of `layout` (peft.h) over base[0, layout.numel()).
// The layout must hold every routed expert (no expert parallelism).
LoraParams bind_lora(const LoraLayout& layout, float* base);

// The adapters a forward applies: a layout and the views over its master
// buffer (which must outlive this object; the optimizer updates it in place
// between forwards).
struct LoraWeights {
  LoraWeights(const LoraLayout& layout, float* params)
      : layout(&layout), flat(params), params(bind_lora(layout, params)) {}
  const LoraLayout* layout;
  float* flat;
  LoraParams params;
  // s = alpha / r rounded to f32 once: the factor every engine multiplies by.
  float scale() const { return static_cast<float>(layout->spec().scale()); }
};

// y (T, out) += (s·(x·Aᵀ))·Bᵀ: u = x·Aᵀ one f32 FMA chain over `in`, each u
// element times s (one f32 multiply), then y + one chain over r (the GEMM's
// accumulate form). Its intermediate rows lie in the memory ctx's kernels
// use, so the adapters run on any backend. x is the projection's f32 input (never fp8-quantized: the
// adapters run in f32 whatever the base storage). y may be a column block of
// a fused output (q/k/v of wqkv, gate/up of gate|up).
void lora_forward(const Context& ctx, Tensor y, const Tensor& x, const LoraPair& p, float s);

// Backward of lora_forward for output gradient dy (T, out): dx (T, in) +=
// (s·(dy·B))·A; dA += (s·(dy·B))ᵀ·x; dB += dyᵀ·(s·(x·Aᵀ)) (the forward's
// scaled u, recomputed with the same kernels). Gradient tensors that are
// empty are skipped.
void lora_backward(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& x, const LoraPair& p,
                   const LoraPair& g, float s);

// Gradient views for a frozen base model (a LoRA trainer's): every
// projection, router, embedding, LM head and bias view is empty, so backward
// skips their weight gradients; the norm weights' gradients, which the norm
// kernels always accumulate and nobody reads, all land in `scratch` (sized here).
// DeepSeek-V4: the gradients of its small f32 tensors (norms, mHC mixers,
// sinks, positional biases) land in a scratch of the layout's size. The
// scratch lies in `memory` (the memory the trainer's kernels use).
ModelParams frozen_base_grads(const ParamLayout& layout, Buffer& scratch, const Allocator& memory);

}  // namespace lockstep::model
