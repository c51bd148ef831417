// LoRA adapters (PEFT's low-rank update) on the packed projections: y = x·Wᵀ
// + s·(x·Aᵀ)·Bᵀ with A (r, in), B (out, r) f32 and s = alpha / r. The base W
// stays frozen at its storage precision; the adapters live in one flat f32
// buffer of their own (LoraLayout), so the optimizer, weight sync and
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
#include "lockstep/tensor/tensor.h"

namespace lockstep::model {

// The [lora] section. rank 0 (or no section): full fine-tuning.
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 16;  // scale s = alpha / rank (PEFT's rule)
  // PEFT module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
  // down_proj), or the one entry "all-linear" (all seven).
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  uint64_t init_seed = 0;  // A's kaiming-uniform draw
  bool enabled() const { return rank > 0; }
  float scale() const { return rank > 0 ? static_cast<float>(alpha / double(rank)) : 0.0f; }
  // The target list with "all-linear" spelled out, in the canonical order.
  std::vector<std::string> modules() const;
};

// Reads [lora]: rank, alpha, dropout (only 0), target_modules, init_seed.
// Throws Error naming the file and key for a bad value.
LoraConfig lora_config_from_toml(TomlSection& s);

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
  LoraMlp mlp;                   // dense layers
  std::vector<LoraMlp> experts;  // (E) MoE layers' routed experts
  LoraMlp shared;                // the shared expert, if any
};

// Typed views over a flat LoRA buffer (parameters, gradients or moments).
struct LoraParams {
  std::vector<LoraLayer> layers;
};

struct LoraTensorInfo {
  std::string name;            // PEFT name: base_model.model.<base>.lora_A.weight
  std::string base;            // the Hugging Face name of the adapted weight
  std::vector<int64_t> shape;  // (r, in) for A, (out, r) for B
  int64_t offset = 0;          // in floats
  int64_t numel = 0;
  bool is_a = false;
};

// The adapters of a model: for every adapted projection in ParamLayout order
// (layers in order; within a layer q, k, v, o, then the MLP's gate, up,
// down, routed experts 0..E-1 and the shared expert), its A then its B.
class LoraLayout {
 public:
  // Error for DeepSeek-V4 (not supported), a bad rank or a target no
  // projection of this model matches.
  LoraLayout(const ParamLayout& base, const LoraConfig& config);

  const LoraConfig& config() const { return config_; }
  int64_t rank() const { return config_.rank; }
  float scale() const { return config_.scale(); }
  const std::vector<LoraTensorInfo>& tensors() const { return tensors_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * sizeof(float); }
  int64_t num_layers() const { return num_layers_; }
  int64_t num_experts() const { return num_experts_; }
  // Views over base[0, numel()).
  LoraParams bind(float* base) const;

 private:
  LoraConfig config_;
  std::vector<LoraTensorInfo> tensors_;
  int64_t numel_ = 0;
  int64_t num_layers_ = 0, num_experts_ = 0;
};

// PEFT's initialisation: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_
// with a = sqrt(5)), element j of A drawn from Philox(seed) on the stream of
// its PEFT name: a pure function of (seed, name, j); B = 0.
void init_lora(const LoraLayout& layout, float* base, uint64_t seed);

// The adapters a forward applies: a layout and the views over its master
// buffer (which must outlive this object; the optimizer updates it in place
// between forwards).
struct LoraWeights {
  LoraWeights(const LoraLayout& layout, float* params)
      : layout(&layout), flat(params), params(layout.bind(params)) {}
  const LoraLayout* layout;
  float* flat;
  LoraParams params;
  float scale() const { return layout->scale(); }
};

// y (T, out) += (s·(x·Aᵀ))·Bᵀ: u = x·Aᵀ one f32 FMA chain over `in`, each u
// element times s (one f32 multiply), then y + one chain over r (the GEMM's
// accumulate form). x is the projection's f32 input (never fp8-quantized: the
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
ModelParams frozen_base_grads(const ParamLayout& layout, Buffer& scratch);

}  // namespace lockstep::model
