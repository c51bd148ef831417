// AdamW over the flat parameter buffer, with warmup + cosine learning-rate
// schedule and global-norm gradient clipping. Weight decay applies to
// matrices only (not to norms and biases), the usual choice in Megatron/HF.
// Frozen tensors (ParamInfo::frozen: Index tables, DeepSeek-V4's indexer)
// are never updated or decayed, and their gradients are zeroed by step()
// before the norm, so they are not counted in it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/base/file_util.h"
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

// The global pre-clip gradient norm, when it is not simply the norm of this
// rank's gradient buffer (expert parallelism: each rank holds only its own
// experts' gradients).
using GradNormFn = std::function<double(const Context& ctx, const float* grads)>;

struct OptimizerStats {
  double grad_norm = 0;  // before clipping
  double lr = 0;
  bool skipped = false;  // non-finite gradient: step skipped, gradients dropped
};

class AdamW {
 public:
  // `layout`: the parameters', gradients' and moments' layout. `model`: the
  // whole model's layout, which checkpoint files use, when it differs (expert
  // parallelism: this rank holds only its own experts); tensors are matched
  // by name. Both must outlive the optimizer.
  // The moments live in `memory` (the device memory of the trainer's context).
  AdamW(const ParamLayout& layout, OptimizerConfig config, const ParamLayout* model = nullptr,
        const Allocator& memory = host_allocator());

  // One step on params from grads (both layout.numel() floats); grads are
  // clipped in place, and frozen tensors' grads zeroed first. A non-finite
  // gradient norm skips the update. `norm`, if set, gives the global norm
  // instead of this buffer's (it sees the zeroed frozen grads).
  OptimizerStats step(const Context& ctx, float* params, float* grads, const GradNormFn& norm = {});

  int64_t steps_done() const { return step_; }
  const OptimizerConfig& config() const { return config_; }
  void set_config(const OptimizerConfig& c) { config_ = c; }

  // Moments and step count, for checkpoints (raw little-endian f32 with a
  // header). A file always holds the moments of the whole model: load() picks
  // this optimizer's tensors out of it by name, and save() needs layout ==
  // model (expert parallelism assembles the file with OptimizerStateWriter).
  void save(const std::string& path);
  void load(const std::string& path);
  // This optimizer's moments (layout.numel() floats each; allocated by now).
  float* m() { ensure_state(); return m_.as<float>(); }
  float* v() { ensure_state(); return v_.as<float>(); }
  const ParamLayout& layout() const { return *layout_; }

 private:
  void ensure_state();

  const ParamLayout* layout_;
  const ParamLayout* model_;
  std::vector<int64_t> model_offset_;  // offset in the model layout of each of layout's tensors
  OptimizerConfig config_;
  const Allocator* memory_;
  Buffer m_, v_;
  int64_t step_ = 0;
};

// The checkpoint file of AdamW::save, written piece by piece: `step`
// optimizer steps done, then n floats of the first moment and n of the
// second, in the model's full layout. Nothing appears at `path` unless
// commit() is reached with all 2n floats written.
class OptimizerStateWriter {
 public:
  OptimizerStateWriter(const std::string& path, int64_t step, int64_t n);
  void write(const float* data, int64_t count);
  void commit();

 private:
  AtomicFile file_;
  int64_t n_, written_ = 0;
};

}  // namespace lockstep::train
