// AdamW on flat buffers: decayed and non-decayed parameter ranges come from
// the layout (ParamKind::Matrix decays); frozen tensors are left alone.
#include "lockstep/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/train/host_copies.h"

namespace lockstep::train {

double lr_at(const OptimizerConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps) return c.lr * double(step) / double(c.warmup_steps);
  if (c.decay_steps <= 0) return c.lr;
  const double progress = std::min(1.0, double(step - c.warmup_steps) / double(c.decay_steps));
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const ParamLayout& layout, OptimizerConfig config, const ParamLayout* model, const Allocator& memory)
    : layout_(&layout), model_(model ? model : &layout), config_(config), memory_(&memory) {
  for (const ParamInfo& info : layout.params()) model_offset_.push_back(model_->at(info.name).offset);
}

// Moments are allocated on first use, so a trainer that only scores does not
// pay 2x the model's memory for them.
void AdamW::ensure_state() {
  if (m_.size() == 0) {
    m_ = Buffer(layout_->nbytes(), *memory_, Fill::Zero, "optimizer first moment");
    v_ = Buffer(layout_->nbytes(), *memory_, Fill::Zero, "optimizer second moment");
  }
}

OptimizerStats AdamW::step(const Context& ctx, float* params, float* grads, const GradNormFn& norm) {
  OptimizerStats s;
  const int64_t n = layout_->numel();
  // A frozen tensor's gradient slots are cleared first, so whatever they hold
  // counts neither in the norm (this buffer's or `norm`'s) nor in clipping.
  for (const auto& info : layout_->params())
    if (info.frozen) memory_->fill(grads + info.offset, 0, size_t(info.numel) * sizeof(float));
  s.grad_norm = norm ? norm(ctx, grads) : grad_norm(ctx, *memory_, grads, n);
  if (!std::isfinite(s.grad_norm)) {
    s.skipped = true;
    memory_->fill(grads, 0, size_t(n) * sizeof(float));
    return s;
  }
  if (config_.grad_clip > 0 && s.grad_norm > config_.grad_clip)
    scale_gradients(ctx, *memory_, grads, n, float(config_.grad_clip / s.grad_norm));
  ensure_state();
  ++step_;
  s.lr = lr_at(config_, step_);
  kernels::AdamWParams p;
  p.lr = float(s.lr);
  p.beta1 = float(config_.beta1);
  p.beta2 = float(config_.beta2);
  p.eps = float(config_.eps);
  p.step = step_;
  for (const auto& info : layout_->params()) {
    // Frozen: no update and no decay; the moments stay zero. (An Index
    // table's slots hold int32 bits, which must never pass through float math.)
    if (info.frozen) continue;
    p.weight_decay = info.kind == ParamKind::Matrix ? float(config_.weight_decay) : 0.0f;
    kernels::adamw_step(ctx, params + info.offset, grads + info.offset, m_.as<float>() + info.offset,
                        v_.as<float>() + info.offset, info.numel, p);
  }
  return s;
}

namespace {
constexpr char kMagic[8] = {'L', 'S', 'A', 'D', 'A', 'M', 'W', '1'};
// Floats of a moment a save or load holds on the host at once (16 MiB).
constexpr int64_t kStateChunk = int64_t{1} << 22;
}

OptimizerStateWriter::OptimizerStateWriter(const std::string& path, int64_t step, int64_t n) : file_(path), n_(n) {
  file_.write(kMagic, 8);
  file_.write(&step, 8);
  file_.write(&n, 8);
}

void OptimizerStateWriter::write(const float* data, int64_t count) {
  LS_CHECK(written_ + count <= 2 * n_) << "optimizer state: more than 2 x " << n_ << " floats written";
  file_.write(data, size_t(count) * 4);
  written_ += count;
}

void OptimizerStateWriter::commit() {
  LS_CHECK(written_ == 2 * n_) << "optimizer state: " << written_ << " of 2 x " << n_ << " floats written";
  file_.commit();
}

void AdamW::save(const std::string& path) {
  LS_CHECK(layout_->numel() == model_->numel())
      << "AdamW::save: this optimizer holds part of the model's moments (Trainer::prepare_checkpoint gathers them)";
  ensure_state();
  OptimizerStateWriter w(path, step_, layout_->numel());
  // Through a bounded host copy where the moments lie in device memory.
  const auto write = [&w](const float* d, int64_t k) { w.write(d, k); };
  for_each_host_chunk(*memory_, m_.as<float>(), layout_->numel(), kStateChunk, write);
  for_each_host_chunk(*memory_, v_.as<float>(), layout_->numel(), kStateChunk, write);
  w.commit();
}

void AdamW::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) LS_THROW << path << ": cannot open optimizer state";
  char magic[8];
  int64_t step = 0, n = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&step), 8);
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || std::memcmp(magic, kMagic, 8) != 0) LS_THROW << path << ": not a lockstep optimizer state file";
  if (n != model_->numel())
    LS_THROW << path << ": optimizer state holds " << n << " parameters, the model has " << model_->numel();
  ensure_state();
  // Each of this optimizer's tensors from its place in the full layout
  // (one read of each moment when the layouts are the same).
  const std::streamoff header = 24;
  for (int moment = 0; moment < 2; ++moment) {
    float* dst = moment == 0 ? m_.as<float>() : v_.as<float>();
    const auto read = [&in](float* d, int64_t k) {
      in.read(reinterpret_cast<char*>(d), std::streamsize(k) * 4);
    };
    if (layout_->numel() == n) {
      in.seekg(header + std::streamoff(moment) * n * 4);
      fill_from_host(*memory_, dst, n, kStateChunk, read);
      continue;
    }
    for (size_t i = 0; i < layout_->params().size(); ++i) {
      const ParamInfo& info = layout_->params()[i];
      in.seekg(header + (std::streamoff(moment) * n + model_offset_[i]) * 4);
      fill_from_host(*memory_, dst + info.offset, info.numel, kStateChunk, read);
    }
  }
  if (!in) LS_THROW << path << ": truncated optimizer state";
  step_ = step;
}

}  // namespace lockstep::train
