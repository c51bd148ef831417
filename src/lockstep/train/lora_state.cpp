// LoraState: the adapters' buffers, their AdamW step and its checkpoint file.
#include "lockstep/train/lora_state.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/adamw.h"

namespace lockstep::train {

LoraState::LoraState(const ParamLayout& base, const model::LoraConfig& config)
    : config_(config), layout_(base, config.spec()) {
  LS_CHECK(base.all_experts())
      << "[lora]: adapters need a trainer holding every expert (no expert parallelism)";
  const size_t bytes = size_t(layout_.numel()) * sizeof(float);
  params_ = Buffer(bytes);
  grads_ = Buffer(bytes);
  m_ = Buffer(bytes);
  v_ = Buffer(bytes);
  init_lora(layout_, params_.as<float>(), config.init_seed);
  grad_views_ = model::bind_lora(layout_, grads_.as<float>());
  base_grads_ = model::frozen_base_grads(base, scratch_);
  weights_ = std::make_unique<model::LoraWeights>(layout_, params_.as<float>());
}

OptimizerStats LoraState::step(const Context& ctx, const OptimizerConfig& optim,
                               const std::function<void(float*, size_t)>& reduce) {
  const int64_t n = numel();
  float* g = grads();
  if (reduce) reduce(g, size_t(n));
  OptimizerStats s;
  s.grad_norm = kernels::global_grad_norm(ctx, g, n);
  if (!std::isfinite(s.grad_norm)) {
    s.skipped = true;
    zero_grad();
    return s;
  }
  if (optim.grad_clip > 0 && s.grad_norm > optim.grad_clip)
    kernels::scale_grads(ctx, {kernels::FloatSegment{g, n}}, float(optim.grad_clip / s.grad_norm));
  ++step_;
  s.lr = lr_at(optim, step_);
  kernels::AdamWParams p;
  p.lr = float(s.lr);
  p.beta1 = float(optim.beta1);
  p.beta2 = float(optim.beta2);
  p.eps = float(optim.eps);
  p.step = step_;
  p.weight_decay = float(optim.weight_decay);
  kernels::adamw_step(ctx, params(), g, m(), v(), n, p);
  zero_grad();
  return s;
}

void LoraState::zero_grad() {
  std::memset(grads_.data(), 0, size_t(numel()) * sizeof(float));
}

namespace {
constexpr char kMagic[8] = {'L', 'S', 'A', 'D', 'A', 'M', 'W', '1'};  // AdamW::save's header
}

void LoraState::save_optimizer(const std::string& path) {
  OptimizerStateWriter w(path, step_, numel());
  w.write(m(), numel());
  w.write(v(), numel());
  w.commit();
}

void LoraState::load_optimizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) LS_THROW << path << ": cannot open the adapters' optimizer state";
  char magic[8];
  int64_t step = 0, n = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&step), 8);
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || std::memcmp(magic, kMagic, 8) != 0) LS_THROW << path << ": not a lockstep optimizer state file";
  if (n != numel())
    LS_THROW << path << ": optimizer state holds " << n << " parameters, the adapters have " << numel()
             << " (another rank or target_modules?)";
  in.read(static_cast<char*>(m_.data()), std::streamsize(n) * 4);
  in.read(static_cast<char*>(v_.data()), std::streamsize(n) * 4);
  if (!in) LS_THROW << path << ": truncated optimizer state";
  step_ = step;
}

}  // namespace lockstep::train
