// A trainer's LoRA state: the adapters' f32 master, gradients and AdamW
// moments, each one flat buffer over the PEFT layout (model/peft.h), and the
// frozen base's gradient views (model::frozen_base_grads). Only the adapters
// train; the base, norms, embeddings and LM head stay as loaded, as in PEFT.
// The buffers lie in the memory the trainer's kernels use (device memory on
// a GPU backend): host code reads them through host_params() or copies.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/lora.h"
#include "lockstep/model/params.h"
#include "lockstep/train/optimizer.h"

namespace lockstep::train {

class LoraState {
 public:
  // Adapters of `config` on the model of `base`, initialised as PEFT does
  // (A kaiming-uniform from config.init_seed, B = 0), in the memory ctx's
  // kernels use.
  LoraState(const Context& ctx, const ParamLayout& base, const model::LoraConfig& config);

  const LoraLayout& layout() const { return layout_; }
  const model::LoraConfig& config() const { return config_; }
  const model::LoraWeights& weights() const { return *weights_; }
  const model::LoraParams& grad_views() const { return grad_views_; }
  const ModelParams& base_grads() const { return base_grads_; }
  int64_t numel() const { return layout_.numel(); }
  float* params() { return params_.as<float>(); }
  float* grads() { return grads_.as<float>(); }
  float* m() { return m_.as<float>(); }
  float* v() { return v_.as<float>(); }
  int64_t steps_done() const { return step_; }
  // The memory the buffers above lie in.
  const Allocator& memory() const { return *memory_; }
  // A host copy of the adapters' parameters (numel() floats).
  std::vector<float> host_params() const;

  // reduce (if set) on the adapters' gradients, the global norm, clipping,
  // AdamW (every adapter is a matrix: weight decay applies), gradients
  // zeroed. A non-finite norm skips the update, as AdamW::step does.
  OptimizerStats step(const Context& ctx, const OptimizerConfig& optim,
                      const std::function<void(float*, size_t)>& reduce);
  void zero_grad();

  // The moments and step count in AdamW::save's file format (over the
  // adapters' numel); load checks the size and names the file.
  void save_optimizer(const std::string& path);
  void load_optimizer(const std::string& path);

 private:
  model::LoraConfig config_;
  LoraLayout layout_;
  Context ctx_;
  const Allocator* memory_;
  Buffer params_, grads_, m_, v_, scratch_;
  model::LoraParams grad_views_;
  ModelParams base_grads_;
  std::unique_ptr<model::LoraWeights> weights_;
  int64_t step_ = 0;
};

}  // namespace lockstep::train
