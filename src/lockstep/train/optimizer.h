// AdamW over the flat parameter buffer, with warmup + cosine learning-rate
// schedule and global-norm gradient clipping. Weight decay applies to
// matrices only (not to norms and biases), the usual choice in Megatron/HF.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/params.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::train {

struct OptimizerConfig {
  double lr = 1e-5;
  double min_lr = 0.0;         // floor of the cosine decay
  int64_t warmup_steps = 0;    // linear from lr/warmup to lr
  int64_t decay_steps = 0;     // cosine from lr to min_lr over this many steps after warmup; 0 = constant
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 1.0;  // max global norm; 0 = no clipping
};

// Learning rate for optimizer step `step` (1-based).
double lr_at(const OptimizerConfig& c, int64_t step);

struct OptimizerStats {
  double grad_norm = 0;  // before clipping
  double lr = 0;
  bool skipped = false;  // non-finite gradient: step skipped, gradients dropped
};

class AdamW {
 public:
  AdamW(const ParamLayout& layout, OptimizerConfig config);

  // One step on params from grads (both layout.numel() floats); grads are
  // clipped in place. A non-finite gradient norm skips the update.
  OptimizerStats step(const Context& ctx, float* params, float* grads);

  int64_t steps_done() const { return step_; }
  const OptimizerConfig& config() const { return config_; }
  void set_config(const OptimizerConfig& c) { config_ = c; }

  // Moments and step count, for checkpoints (raw little-endian f32 with a header).
  void save(const std::string& path);
  void load(const std::string& path);

 private:
  void ensure_state();

  const ParamLayout* layout_;
  OptimizerConfig config_;
  Buffer m_, v_;
  int64_t step_ = 0;
};

}  // namespace lockstep::train
