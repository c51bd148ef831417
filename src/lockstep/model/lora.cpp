// The engines' views of the adapters (over peft.h's layout) and the
// adapters' forward and backward products; the [lora] section is read in
// lora_config.cpp.
#include "lockstep/model/lora.h"

#include <algorithm>
#include <cmath>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/v4_rows.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::model {

LoraParams bind_lora(const LoraLayout& layout, float* base) {
  int64_t L = 0, E = 0;
  for (const LoraProjection& p : layout.projections()) {
    L = std::max(L, p.layer + 1);
    E = std::max(E, p.expert + 1);
  }
  LoraParams m;
  m.layers.resize(size_t(L));
  for (LoraLayer& layer : m.layers) layer.experts.resize(size_t(E));
  const int64_t r = layout.rank();
  for (const LoraProjection& p : layout.projections()) {
    LoraLayer& layer = m.layers[size_t(p.layer)];
    LoraMlp* mlp = &layer.mlp;
    if (p.expert >= 0)
      mlp = &layer.experts[size_t(p.expert)];
    else if (p.base_name.find("shared_expert") != std::string::npos)
      mlp = &layer.shared;
    LoraPair* pair = &mlp->down;  // down_proj, w2
    if (p.module == "wq_a")
      pair = &layer.wq_a;
    else if (p.module == "wkv")
      pair = &layer.wkv;
    else if (p.module == "wq_b")
      pair = &layer.wq_b;
    else if (p.module == "wo_b")
      pair = &layer.wo_b;
    else if (p.module == "w1" || p.module == "gate_proj")  // DeepSeek-V4's name, then PEFT's
      pair = &mlp->gate;
    else if (p.module == "w3" || p.module == "up_proj")
      pair = &mlp->up;
    else if (p.module == "q_proj")
      pair = &layer.q;
    else if (p.module == "k_proj")
      pair = &layer.k;
    else if (p.module == "v_proj")
      pair = &layer.v;
    else if (p.module == "o_proj")
      pair = &layer.o;
    pair->a = Tensor(base + p.a_offset, DType::F32, {r, p.in_features});
    pair->b = Tensor(base + p.b_offset, DType::F32, {p.out_features, r});
  }
  return m;
}

namespace {
// (T, r) rows in the memory ctx's kernels use.
OwnedTensor rank_rows(const Context& ctx, int64_t T, int64_t r) {
  return OwnedTensor(DType::F32, {T, r}, kernels::device_memory(ctx), Fill::Undefined, "lora rank rows");
}

// us (T, r) = s·(x·Aᵀ): the chain over `in`, then one f32 multiply each.
OwnedTensor scaled_down(const Context& ctx, const Tensor& x, const LoraPair& p, float s) {
  const int64_t T = x.dim(0), r = p.a.dim(0);
  OwnedTensor us = rank_rows(ctx, T, r);
  if (T == 0) return us;
  kernels::gemm_xwt(ctx, us.view(), x, p.a);
  kernels::scale_values(ctx, us.view(), s);
  return us;
}
}  // namespace

void lora_forward(const Context& ctx, Tensor y, const Tensor& x, const LoraPair& p, float s) {
  if (!p.on() || x.dim(0) == 0) return;
  const OwnedTensor us = scaled_down(ctx, x, p, s);
  kernels::gemm_xwt(ctx, y, us.view(), p.b, true);
}

void lora_backward(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& x, const LoraPair& p,
                   const LoraPair& g, float s) {
  if (!p.on() || x.dim(0) == 0) return;
  const int64_t T = x.dim(0), r = p.a.dim(0);
  // du (T, r) = s·(dy·B): the gradient of the scaled down-projection.
  OwnedTensor du = rank_rows(ctx, T, r);
  kernels::gemm_dyw(ctx, du.view(), dy, p.b);
  kernels::scale_values(ctx, du.view(), s);
  if (g.b.data != nullptr) kernels::gemm_dytx(ctx, g.b, dy, scaled_down(ctx, x, p, s).view());
  if (g.a.data != nullptr) kernels::gemm_dytx(ctx, g.a, du.view(), x);
  if (dx.data != nullptr) kernels::gemm_dyw(ctx, dx, du.view(), p.a, true);
}

namespace {
// DeepSeek-V4: the small f32 tensors (norms, mHC mixers, sinks, the
// compressors' positional biases), whose gradients V4's kernels always
// accumulate, get views into a scratch buffer the layout's size; every
// projection's view is empty, so backward skips its weight-gradient GEMM.
ModelParams frozen_v4_grads(const ParamLayout& layout, Buffer& scratch, const Allocator& memory) {
  scratch = Buffer(layout.nbytes(), memory, Fill::Zero, "lora frozen base gradients");
  ModelParams m = bind(layout, scratch.as<float>());
  m.embed = m.lm_head = Tensor();
  auto freeze = [](LayerParams& L) {
    L.wq_a = L.wkv = L.wq_b = L.wo_a = L.wo_b = L.router = Tensor();
    L.cmp_wkv = L.cmp_wgate = Tensor();
    L.idx_wq_b = L.idx_wproj = L.idx_cmp_wkv = L.idx_cmp_wgate = Tensor();
    L.experts_gate_up = L.experts_down = Tensor();
    for (MlpParams& e : L.experts) e.w_gate = e.w_up = e.w_gate_up = e.w_down = Tensor();
    L.shared.w_gate = L.shared.w_up = L.shared.w_gate_up = L.shared.w_down = Tensor();
  };
  for (LayerParams& L : m.layers) freeze(L);
  for (MtpParams& t : m.mtp) {
    t.e_proj = t.h_proj = Tensor();
    freeze(t.block);
  }
  return m;
}
}  // namespace

ModelParams frozen_base_grads(const ParamLayout& layout, Buffer& scratch, const Allocator& memory) {
  const ModelConfig& c = layout.config();
  if (c.is_v4()) return frozen_v4_grads(layout, scratch, memory);
  const int64_t D = c.hidden_size, Dh = c.head_dim;
  scratch = Buffer(size_t(std::max(D, Dh)) * sizeof(float), memory, Fill::Zero, "lora frozen base gradients");
  float* s = scratch.as<float>();
  ModelParams m;
  m.final_norm = Tensor(s, DType::F32, {D});
  m.layers.resize(size_t(c.num_layers));
  for (LayerParams& L : m.layers) {
    L.attn_norm = Tensor(s, DType::F32, {D});
    L.mlp_norm = Tensor(s, DType::F32, {D});
    if (c.qk_norm) {
      L.q_norm = Tensor(s, DType::F32, {Dh});
      L.k_norm = Tensor(s, DType::F32, {Dh});
    }
    L.experts.resize(size_t(c.num_experts));
  }
  return m;
}

}  // namespace lockstep::model
