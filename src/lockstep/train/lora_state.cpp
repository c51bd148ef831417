// LoraState: the adapters' buffers, their AdamW step and its checkpoint file.
#include "lockstep/train/lora_state.h"

#include <cmath>
#include <cstring>
#include <fstream>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/train/host_copies.h"

namespace lockstep::train {

LoraState::LoraState(const Context& ctx, const ParamLayout& base, const model::LoraConfig& config)
    : config_(config), layout_(base, config.spec()), ctx_(ctx), memory_(&kernels::device_memory(ctx)) {
  LS_CHECK(base.all_experts())
      << "[lora]: adapters need a trainer holding every expert (no expert parallelism)";
  const size_t bytes = size_t(layout_.numel()) * sizeof(float);
  params_ = Buffer(bytes, *memory_, Fill::Zero, "lora adapters");
  grads_ = Buffer(bytes, *memory_, Fill::Zero, "lora gradients");
  m_ = Buffer(bytes, *memory_, Fill::Zero, "lora first moment");
  v_ = Buffer(bytes, *memory_, Fill::Zero, "lora second moment");
  std::vector<float> init(size_t(layout_.numel()), 0.0f);
  init_lora(layout_, init.data(), config.init_seed);
  memory_->copy_in(params_.data(), init.data(), bytes);
  grad_views_ = model::bind_lora(layout_, grads_.as<float>());
  base_grads_ = model::frozen_base_grads(base, scratch_, *memory_);
  weights_ = std::make_unique<model::LoraWeights>(layout_, params_.as<float>());
}

std::vector<float> LoraState::host_params() const {
  std::vector<float> out(size_t(layout_.numel()));
  memory_->copy_out(out.data(), params_.data(), out.size() * sizeof(float));
  return out;
}

OptimizerStats LoraState::step(const Context& ctx, const OptimizerConfig& optim,
                               const std::function<void(float*, size_t)>& reduce) {
  const int64_t n = numel();
  float* g = grads();
  if (reduce) reduce_through_host(*memory_, g, n, reduce);
  OptimizerStats s;
  s.grad_norm = grad_norm(ctx, *memory_, g, n);
  if (!std::isfinite(s.grad_norm)) {
    s.skipped = true;
    zero_grad();
    return s;
  }
  if (optim.grad_clip > 0 && s.grad_norm > optim.grad_clip)
    scale_gradients(ctx, *memory_, g, n, float(optim.grad_clip / s.grad_norm));
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
  zero_memory(ctx_, *memory_, grads_.data(), size_t(numel()) * sizeof(float));
}

namespace {
constexpr char kMagic[8] = {'L', 'S', 'A', 'D', 'A', 'M', 'W', '1'};  // AdamW::save's header

// Floats of a moment a save or load holds on the host at once (16 MiB).
constexpr int64_t kStateChunk = int64_t{1} << 22;
}  // namespace

void LoraState::save_optimizer(const std::string& path) {
  OptimizerStateWriter w(path, step_, numel());
  for (const float* moment : {m(), v()})
    for_each_host_chunk(*memory_, moment, numel(), kStateChunk,
                        [&](const float* d, int64_t k) { w.write(d, k); });
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
  for (float* moment : {m(), v()})
    fill_from_host(*memory_, moment, n, kStateChunk, [&in](float* d, int64_t k) {
      in.read(reinterpret_cast<char*>(d), std::streamsize(k) * 4);
    });
  if (!in) LS_THROW << path << ": truncated optimizer state";
  step_ = step;
}

}  // namespace lockstep::train
