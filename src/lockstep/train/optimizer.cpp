// AdamW on flat buffers: decayed and non-decayed parameter ranges come from
// the layout (ParamKind::Matrix decays).
#include "lockstep/train/optimizer.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/model/file_util.h"

namespace lockstep::train {

double lr_at(const OptimizerConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps) return c.lr * double(step) / double(c.warmup_steps);
  if (c.decay_steps <= 0) return c.lr;
  const double progress = std::min(1.0, double(step - c.warmup_steps) / double(c.decay_steps));
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const ParamLayout& layout, OptimizerConfig config)
    : layout_(&layout), config_(config) {}

// Moments are allocated on first use, so a trainer that only scores does not
// pay 2x the model's memory for them.
void AdamW::ensure_state() {
  if (m_.size() == 0) {
    m_ = Buffer(layout_->nbytes());
    v_ = Buffer(layout_->nbytes());
  }
}

OptimizerStats AdamW::step(const Context& ctx, float* params, float* grads) {
  OptimizerStats s;
  const int64_t n = layout_->numel();
  s.grad_norm = kernels::global_grad_norm(ctx, grads, n);
  if (!std::isfinite(s.grad_norm)) {
    s.skipped = true;
    std::memset(grads, 0, size_t(n) * sizeof(float));
    return s;
  }
  if (config_.grad_clip > 0) kernels::clip_grad_norm(ctx, grads, n, config_.grad_clip);
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
    p.weight_decay = info.kind == ParamKind::Matrix ? float(config_.weight_decay) : 0.0f;
    kernels::adamw_step(ctx, params + info.offset, grads + info.offset, m_.as<float>() + info.offset,
                        v_.as<float>() + info.offset, info.numel, p);
  }
  return s;
}

namespace {
constexpr char kMagic[8] = {'L', 'S', 'A', 'D', 'A', 'M', 'W', '1'};
}

void AdamW::save(const std::string& path) {
  ensure_state();
  AtomicFile f(path);
  f.write(kMagic, 8);
  const int64_t n = layout_->numel();
  f.write(&step_, 8);
  f.write(&n, 8);
  f.write(m_.data(), size_t(n) * 4);
  f.write(v_.data(), size_t(n) * 4);
  f.commit();
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
  if (n != layout_->numel())
    LS_THROW << path << ": optimizer state holds " << n << " parameters, the model has " << layout_->numel();
  ensure_state();
  in.read(static_cast<char*>(m_.data()), std::streamsize(n) * 4);
  in.read(static_cast<char*>(v_.data()), std::streamsize(n) * 4);
  if (!in) LS_THROW << path << ": truncated optimizer state";
  step_ = step;
}

}  // namespace lockstep::train
