// Backward of DeepSeek-V4's forward for the training case (every token new):
// activation gradients written, parameter gradients accumulated (+=) in a
// fixed order, so the result is a pure function of the batch. The indexer's
// selection and the hash table are constants; the indexer's own weights get
// no gradient (its inputs are detached, as in DeepSeek's training recipe).
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/embedding.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/kv_compress.h"
#include "lockstep/kernels/cpu/rmsnorm.h"
#include "lockstep/kernels/cpu/rope.h"
#include "lockstep/kernels/cpu/sparse_attention.h"
#include "lockstep/kernels/cpu/v4_rows.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/forward_util.h"
#include "lockstep/model/v4_forward.h"
#include "lockstep/model/v4_util.h"

namespace lockstep::model {

namespace k = lockstep::kernels;

namespace {

const DType f32 = DType::F32;

struct V4BackEnv {
  const Context& ctx;
  const ModelConfig& c;
  const ModelWeights& weights;
  const ModelParams& p;  // the weights backward multiplies by (straight-through in bf16/fp8)
  const ModelParams& g;  // gradients
  const KvCache& kv;
  const V4Batch& vb;
  int64_t T;
  const Activations& saved;  // experts (expert parallelism), fold_expert_grads, indexer_loss_scale
  const RaggedBatch& batch;
};

// A projection's weight gradient, skipped where dw is empty (a LoRA
// trainer's frozen base: frozen_base_grads).
void weight_grad(const Context& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                 const kernels::PackedWeight& pw) {
  if (dw.data != nullptr) project_dw(ctx, dw, dy, x, pw);
}
void weight_grad(const Context& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  if (dw.data != nullptr) k::gemm_dytx(ctx, dw, dy, x);
}

// Layer l's adapters and their gradients (null without LoRA or in an MTP
// block), and their scale.
struct V4LayerLora {
  const LoraLayer* w = nullptr;
  const LoraLayer* g = nullptr;
  float s = 0.0f;
  V4LayerLora(const V4BackEnv& env, int64_t l) : w(v4_lora(env.weights, l)), s(v4_lora_scale(env.weights)) {
    if (w == nullptr) return;
    LS_CHECK(env.saved.lora_grads != nullptr)
        << "backward: the weights carry LoRA adapters, no gradient was given";
    g = &env.saved.lora_grads->layers[size_t(l)];
  }
  const LoraMlp* shared_w() const { return w ? &w->shared : nullptr; }
  const LoraMlp* shared_g() const { return g ? &g->shared : nullptr; }
};

// The adapters' backward of one expert (MLP) on rows: the down adapter
// into dact (before the SwiGLU), or gate and up into dx (after it).
void lora_mlp_down(const Context& ctx, Tensor dact, const Tensor& dy, const Tensor& act, const LoraMlp* w,
                   const LoraMlp* g, float s) {
  if (w) lora_backward(ctx, dact, dy, act, w->down, g->down, s);
}
void lora_mlp_gate_up(const Context& ctx, Tensor dx, const Tensor& dgu, const Tensor& x, const LoraMlp* w,
                      const LoraMlp* g, float s) {
  if (!w) return;
  const int64_t F = dgu.dim(1) / 2;
  lora_backward(ctx, dx, dgu.slice_cols(0, F), x, w->gate, g->gate, s);
  lora_backward(ctx, dx, dgu.slice_cols(F, 2 * F), x, w->up, g->up, s);
}

// Backward of expert_rows_forward (v4_forward.cpp) on the rows of `rows` (a
// plan, or an expert route's local rows): dy (rows, D) the outputs'
// gradient, x the rows' inputs, w their routing weights. Writes dx (rows, D)
// and dw (w's shape); adds the experts' weight gradients. Every step is per
// row but the weight gradients, which come last: with
// Activations::fold_expert_grads (expert parallelism, world_invariant) one
// per source rank's rows, each folded away before the next.
void expert_rows_backward(const V4BackEnv& env, int64_t l, const V4LayerActivations& a,
                          const k::MoeDispatch& rows, const Tensor& dy, const Tensor& x, const Tensor& w,
                          Tensor dx, Tensor dw) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t R = dy.dim(0), Fe = c.moe_intermediate_size, E = c.num_experts;
  const LayerParams& p = block_params(env.p, l);
  const LayerParams& g = block_params(env.g, l);
  const PackedLayer& q = env.weights.layer(l);
  OwnedTensor dacts = device_tensor(env.ctx, f32, {R, Fe}), dact = device_tensor(env.ctx, f32, {R, Fe}),
              dgu = device_tensor(env.ctx, f32, {R, 2 * Fe});
  const Tensor gu = a.gu_e.view();
  const V4LayerLora lora(env, l);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = rows.offsets[size_t(e)], r1 = rows.offsets[size_t(e) + 1];
    if (r1 == r0) continue;
    k::gemm_dyw(ctx, dacts.view().slice_rows(r0, r1), dy.slice_rows(r0, r1), p.experts[size_t(e)].w_down);
    lora_mlp_down(ctx, dacts.view().slice_rows(r0, r1), dy.slice_rows(r0, r1),
                  a.acts_e.view().slice_rows(r0, r1), lora_expert(lora.w, e), lora_expert(lora.g, e), lora.s);
  }
  k::moe_scale_rows_backward(ctx, dact.view(), dw, dacts.view(), a.act_e.view(), w, rows);
  swiglu_v4_backward(ctx, dgu.view().slice_cols(0, Fe), dgu.view().slice_cols(Fe, 2 * Fe), dact.view(),
                     gu.slice_cols(0, Fe), gu.slice_cols(Fe, 2 * Fe), c.swiglu_limit);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = rows.offsets[size_t(e)], r1 = rows.offsets[size_t(e) + 1];
    if (r1 == r0) continue;
    k::gemm_dyw(ctx, dx.slice_rows(r0, r1), dgu.view().slice_rows(r0, r1), p.experts[size_t(e)].w_gate_up);
    lora_mlp_gate_up(ctx, dx.slice_rows(r0, r1), dgu.view().slice_rows(r0, r1), x.slice_rows(r0, r1),
                     lora_expert(lora.w, e), lora_expert(lora.g, e), lora.s);
  }
  // The weight gradients of rows [r0, r1) of expert e.
  const auto weight_grads = [&](int64_t e, int64_t r0, int64_t r1) {
    weight_grad(ctx, g.experts[size_t(e)].w_down, dy.slice_rows(r0, r1), a.acts_e.view().slice_rows(r0, r1),
                q.experts[size_t(e)].down);
    weight_grad(ctx, g.experts[size_t(e)].w_gate_up, dgu.view().slice_rows(r0, r1), x.slice_rows(r0, r1),
                q.experts[size_t(e)].gate_up);
  };
  const bool per_source = env.saved.experts != nullptr && env.saved.fold_expert_grads;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = rows.offsets[size_t(e)], r1 = rows.offsets[size_t(e) + 1];
    if (r1 == r0) continue;
    if (!per_source) {
      weight_grads(e, r0, r1);
      continue;
    }
    const int64_t P = a.route.ranks();
    for (int64_t src = 0, s0 = r0; src < P; ++src) {
      const int64_t s1 = s0 + a.route.by_source[size_t(e * P + src)];
      if (s1 > s0) {
        weight_grads(e, s0, s1);
        env.saved.fold_expert_grads(g.experts[size_t(e)], ctx);
      }
      s0 = s1;
    }
  }
}

// dz (T, D) = gradient of the MoE input given df (T, D) of its output.
void moe_backward(const V4BackEnv& env, int64_t l, const V4LayerActivations& a, const Tensor& df, Tensor dz) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t T = env.T, D = c.hidden_size, K = c.num_experts_per_tok, Fe = c.moe_intermediate_size,
                E = c.num_experts;
  const LayerParams& p = block_params(env.p, l);
  const LayerParams& g = block_params(env.g, l);
  const k::MoeDispatch& plan = a.plan;
  const PackedLayer& q = env.weights.layer(l);
  // The shared expert.
  OwnedTensor dact_s = device_tensor(env.ctx, f32, {T, Fe}), dgu_s = device_tensor(env.ctx, f32, {T, 2 * Fe});
  const V4LayerLora lora(env, l);
  k::gemm_dyw(ctx, dact_s.view(), df, p.shared.w_down);
  lora_mlp_down(ctx, dact_s.view(), df, a.act_s.view(), lora.shared_w(), lora.shared_g(), lora.s);
  weight_grad(ctx, g.shared.w_down, df, a.act_s.view(), q.shared.down);
  const Tensor gu_s = a.gu_s.view();
  swiglu_v4_backward(ctx, dgu_s.view().slice_cols(0, Fe), dgu_s.view().slice_cols(Fe, 2 * Fe), dact_s.view(),
                     gu_s.slice_cols(0, Fe), gu_s.slice_cols(Fe, 2 * Fe), c.swiglu_limit);
  k::gemm_dyw(ctx, dz, dgu_s.view(), p.shared.w_gate_up);
  lora_mlp_gate_up(ctx, dz, dgu_s.view(), a.z.view(), lora.shared_w(), lora.shared_g(), lora.s);
  weight_grad(ctx, g.shared.w_gate_up, dgu_s.view(), a.z.view(), q.shared.gate_up);
  // The routed experts: down projection, routing weight, SwiGLU, up projection.
  OwnedTensor dye = device_tensor(env.ctx, f32, {T * K, D}), dxe = device_tensor(env.ctx, f32, {T * K, D}),
              dw = device_tensor(env.ctx, f32, {T, K});
  k::moe_sum_backward(ctx, dye.view(), df, plan);
  if (env.saved.experts == nullptr) {
    expert_rows_backward(env, l, a, plan, dye.view(), a.xe.view(), a.topk_w.view(), dxe.view(), dw.view());
  } else {
    // The output gradients travel the forward's route, the input and
    // routing-weight gradients come back.
    ExpertComm& comm = *env.saved.experts;
    const ExpertRoute& route = a.route;
    const int64_t N = route.num_in();
    OwnedTensor dyr = device_tensor(env.ctx, f32, {N, D}), dxr = device_tensor(env.ctx, f32, {N, D}),
                dwr = device_tensor(env.ctx, f32, {N, 1}), stage = device_tensor(env.ctx, f32, {N, D}),
                stage_w = device_tensor(env.ctx, f32, {N, 1}), dws = device_tensor(env.ctx, f32, {T * K, 1});
    expert_dispatch(ctx, comm, route, dye.view(), dyr.view(), stage.view());
    expert_rows_backward(env, l, a, route.local, dyr.view(), a.xe.view(), a.w_rows.view(), dxr.view(),
                         dwr.view());
    expert_return(ctx, comm, route, dxr.view(), dxe.view(), stage.view());
    expert_return(ctx, comm, route, dwr.view(), dws.view(), stage_w.view());
    k::moe_row_weights_backward(ctx, dw.view(), dws.view(), plan);
  }
  k::moe_gather_backward(ctx, dz, dxe.view(), plan);
  // The router (its selection is constant; the weights carry the gradient).
  OwnedTensor dlogits = device_tensor(env.ctx, f32, {T, E});
  k::moe_route_backward(ctx, dlogits.view(), dw.view(), a.scores.view(), a.topk_idx.view(), router_config(c));
  k::gemm_dyw(ctx, dz, dlogits.view(), p.router, true);
  weight_grad(ctx, g.router, dlogits.view(), a.z.view());
}

// da += the compressed entries' gradient through the compressor (rows of
// dstore at each entry's slot).
void compressor_backward(const V4BackEnv& env, int64_t l, const V4LayerActivations& a, const Tensor& dstore,
                         Tensor da) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t ratio = c.compress_ratio(l), kappa = ratio == 4 ? 2 : 1, Dh = c.head_dim, T = env.T;
  const int64_t Ne = a.entries.count();
  const LayerParams& p = block_params(env.p, l);
  const LayerParams& g = block_params(env.g, l);
  OwnedTensor dentry = device_tensor(env.ctx, f32, {Ne, 1, Dh}), dpre = device_tensor(env.ctx, f32, {Ne, Dh});
  load_rows(ctx, dentry.view().reshape({Ne, Dh}), dstore, a.entries.slot, 2, 1);
  const OwnedTensor pos = device_i32(ctx, a.entries.pos, {Ne});
  k::rope_interleaved_inverse(ctx, rope_tail(dentry.view(), c.qk_rope_head_dim), pos.view(),
                              env.weights.rope_of_layer(l));
  k::rmsnorm_backward(ctx, dpre.view(), g.cmp_norm, dentry.view().reshape({Ne, Dh}), a.entry_pre.view(), p.cmp_norm,
                      a.rstd_entry.view());
  const Tensor cz_store = env.kv.cz_store(l);
  OwnedTensor dcz_store = device_tensor(env.ctx, f32, {cz_store.dim(0), cz_store.dim(1)}),
              dcz = device_tensor(env.ctx, f32, {T, 2 * kappa * Dh});
  zero_tensor(env.ctx, dcz_store.view());
  if (Ne > 0) {
    const OwnedTensor rows = device_i32(ctx, a.entries.rows, {Ne, kappa * ratio});
    k::compress_backward(ctx, dcz_store.view(), g.cmp_ape, dpre.view(), cz_store, rows.view(), p.cmp_ape,
                         int(ratio), ratio == 4);
  }
  load_rows(ctx, dcz.view(), dcz_store.view(), env.vb.slots, 1, 0);
  k::gemm_dyw(ctx, da, dcz.view(), stacked_rows(p.cmp_wkv, p.cmp_wgate), true);
  if (g.cmp_wkv.data != nullptr)
    k::gemm_dytx(ctx, stacked_rows(g.cmp_wkv, g.cmp_wgate), dcz.view(), a.a.view());
}

// The indexer loss's gradient (indexer_kl in v4_forward.cpp) into the
// lightning indexer's weights of CSA layer l: d(loss)/d(score) = scale x
// (student - teacher) for each chosen entry, through the scores
// sum_h w_h * relu(qi_h . key), the query and head-weight projections and
// the keys' own compressor. The indexer's inputs (a, qr) are detached: they
// get no gradient from it.
void indexer_backward(const V4BackEnv& env, int64_t l, const V4LayerActivations& a, double scale) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t T = env.T, HI = c.index_n_heads, DI = c.index_head_dim, KI = c.index_topk,
                Dr = c.qk_rope_head_dim;
  const LayerParams& p = block_params(env.p, l);
  const LayerParams& g = block_params(env.g, l);
  const kernels::RopeTable& rope = env.weights.rope_of_layer(l);
  const Tensor keys = env.kv.index_keys(l);
  // The scores' backward runs on the host on copies of its inputs
  // (host_readable); its three gradients go back in one copy each.
  std::vector<float> dqi_h(size_t(T * HI * DI)), dwt_h(size_t(T * HI)), dkeys_h(size_t(keys.dim(0) * DI));
  std::vector<unsigned char> keep_qi, keep_w, keep_ds, keep_keys;
  const float* qi = k::host_readable(a.idx_q.view(), keep_qi).f32();
  const float* wt = k::host_readable(a.idx_w.view(), keep_w).f32();
  const float* dscore = k::host_readable(a.idx_dscore.view(), keep_ds).f32();
  const float* key_rows = k::host_readable(keys, keep_keys).f32();
  // One thread: the keys' gradients gather from every query, in token order.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = env.vb.seq[size_t(t)];
    for (int64_t k = 0; k < KI; ++k) {
      const int32_t e = a.idx_chosen[size_t(t * KI + k)];
      if (e < 0) break;
      const float gk = float(scale * double(dscore[t * KI + k]));
      const int64_t row = env.vb.slot(s, (e + 1) * 4 - 1);
      const float* key = key_rows + row * DI;
      float* dkey = dkeys_h.data() + row * DI;
      for (int64_t h = 0; h < HI; ++h) {
        const float* q = qi + (t * HI + h) * DI;
        float u = 0;
        for (int64_t d = 0; d < DI; ++d) u += q[d] * key[d];
        if (!(u > 0)) continue;  // relu: no gradient through a negative dot
        dwt_h[size_t(t * HI + h)] += gk * u;
        const float gw = gk * wt[t * HI + h];
        float* dq = dqi_h.data() + (t * HI + h) * DI;
        for (int64_t d = 0; d < DI; ++d) {
          dq[d] += gw * key[d];
          dkey[d] += gw * q[d];
        }
      }
    }
  }
  OwnedTensor dqi = device_tensor(env.ctx, f32, {T, HI, DI}), dwt = device_tensor(env.ctx, f32, {T, HI}),
              dkeys = device_tensor(env.ctx, f32, {keys.dim(0), DI});
  const Allocator& memory = k::device_memory(ctx);
  if (!dqi_h.empty()) memory.copy_in(dqi.view().data, dqi_h.data(), dqi_h.size() * sizeof(float));
  if (!dwt_h.empty()) memory.copy_in(dwt.view().data, dwt_h.data(), dwt_h.size() * sizeof(float));
  if (!dkeys_h.empty()) memory.copy_in(dkeys.view().data, dkeys_h.data(), dkeys_h.size() * sizeof(float));
  // Head weights: wt = head_scale * (a . weights_projᵀ).
  k::scale_values(ctx, dwt.view(), indexer_head_scale(c));
  k::gemm_dytx(ctx, g.idx_wproj, dwt.view(), a.a.view());
  // Queries: qi = RoPE(qr . wq_bᵀ); the rotation's transpose is its inverse.
  k::rope_interleaved_inverse(ctx, rope_tail(dqi.view(), Dr), env.vb.positions.view(), rope);
  k::gemm_dytx(ctx, g.idx_wq_b, dqi.view().reshape({T, HI * DI}), a.qr.view());
  // Keys: RoPE(norm(compress(cz))) of each completed entry, cz = a . [wkv; wgate]ᵀ;
  // the compressor's intermediates are recomputed (the forward keeps only the keys).
  const EntryBatch entries = completed_entries(env.batch, env.vb, 4, true);
  const int64_t Ne = entries.count();
  if (Ne == 0) return;
  const Tensor cz_store = env.kv.index_cz(l);
  const OwnedTensor rows_t = device_i32(ctx, entries.rows, {Ne, 8});
  const Tensor rows = rows_t.view();
  OwnedTensor pre = device_tensor(env.ctx, f32, {Ne, DI}), normed = device_tensor(env.ctx, f32, {Ne, DI}),
              rstd = device_tensor(env.ctx, f32, {Ne}), dentry = device_tensor(env.ctx, f32, {Ne, 1, DI}),
              dpre = device_tensor(env.ctx, f32, {Ne, DI});
  k::compress_forward(ctx, pre.view(), cz_store, rows, p.idx_cmp_ape, 4, true);
  k::rmsnorm_forward(ctx, normed.view(), rstd.view(), pre.view(), p.idx_cmp_norm, float(c.rms_norm_eps));
  load_rows(ctx, dentry.view().reshape({Ne, DI}), dkeys.view(), entries.slot, 1, 0);
  const OwnedTensor pos = device_i32(ctx, entries.pos, {Ne});
  k::rope_interleaved_inverse(ctx, rope_tail(dentry.view(), Dr), pos.view(), rope);
  k::rmsnorm_backward(ctx, dpre.view(), g.idx_cmp_norm, dentry.view().reshape({Ne, DI}), pre.view(),
                      p.idx_cmp_norm, rstd.view());
  OwnedTensor dcz_store = device_tensor(env.ctx, f32, {cz_store.dim(0), cz_store.dim(1)}),
              dcz = device_tensor(env.ctx, f32, {T, 4 * DI});
  zero_tensor(env.ctx, dcz_store.view());
  k::compress_backward(ctx, dcz_store.view(), g.idx_cmp_ape, dpre.view(), cz_store, rows, p.idx_cmp_ape, 4,
                       true);
  load_rows(ctx, dcz.view(), dcz_store.view(), env.vb.slots, 1, 0);
  k::gemm_dytx(ctx, stacked_rows(g.idx_cmp_wkv, g.idx_cmp_wgate), dcz.view(), a.a.view());
}

// da (T, D) = gradient of attn_norm's output given df (T, D) of the attention output.
void attention_backward(const V4BackEnv& env, int64_t l, const V4LayerActivations& a, const Tensor& df, Tensor da) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t T = env.T, H = c.num_heads, Dh = c.head_dim, G = c.o_groups, Ro = c.o_lora_rank,
                Rq = c.q_lora_rank, Dr = c.qk_rope_head_dim, per_group = H * Dh / G;
  const LayerParams& p = block_params(env.p, l);
  const LayerParams& g = block_params(env.g, l);
  const kernels::RopeTable& rope = env.weights.rope_of_layer(l);
  const Tensor positions = env.vb.positions.view();
  const PackedLayer& q = env.weights.layer(l);
  // Output projections, then the inverse RoPE's transpose (the forward rotation).
  OwnedTensor dyo = device_tensor(env.ctx, f32, {T, G * Ro}), dattn = device_tensor(env.ctx, f32, {T, H, Dh});
  const V4LayerLora lora(env, l);
  k::gemm_dyw(ctx, dyo.view(), df, p.wo_b);
  if (lora.w) lora_backward(ctx, dyo.view(), df, a.yo.view(), lora.w->wo_b, lora.g->wo_b, lora.s);
  weight_grad(ctx, g.wo_b, df, a.yo.view(), q.wo_b);
  Tensor do_ = dattn.view().reshape({T, H * Dh});
  for (int64_t gi = 0; gi < G; ++gi) {
    const Tensor dy_g = dyo.view().slice_cols(gi * Ro, (gi + 1) * Ro);
    k::gemm_dyw(ctx, do_.slice_cols(gi * per_group, (gi + 1) * per_group), dy_g,
                p.wo_a.slice_rows(gi * Ro, (gi + 1) * Ro));
    if (g.wo_a.data != nullptr)
      project_dw(ctx, g.wo_a.slice_rows(gi * Ro, (gi + 1) * Ro), dy_g,
                 a.o.view().slice_cols(gi * per_group, (gi + 1) * per_group), q.wo_a[size_t(gi)]);
  }
  k::rope_interleaved_forward(ctx, rope_tail(dattn.view(), Dr), positions, rope);
  // The attention core: dq, and the gradient of every store row it read.
  const Tensor store = env.kv.kv_store(l);
  OwnedTensor dq = device_tensor(env.ctx, f32, {T, H, Dh}),
              dstore = device_tensor(env.ctx, f32, {store.dim(0), store.dim(1)});
  zero_tensor(env.ctx, dstore.view());
  k::sparse_attention_backward(ctx, dq.view(), dstore.view(), g.attn_sink, dattn.view(), a.attn.view(), a.lse.view(),
                               a.q.view(), store, a.cand.view(), p.attn_sink, attention_scale(c));
  // The query path: RoPE, the per-head RMS, wq_b, q_norm, wq_a.
  k::rope_interleaved_inverse(ctx, rope_tail(dq.view(), Dr), positions, rope);
  OwnedTensor dq_pre = device_tensor(env.ctx, f32, {T * H, Dh}), dones = device_tensor(env.ctx, f32, {Dh}),
              dqr = device_tensor(env.ctx, f32, {T, Rq}), dqa = device_tensor(env.ctx, f32, {T, Rq});
  zero_tensor(env.ctx, dones.view());
  k::rmsnorm_backward(ctx, dq_pre.view(), dones.view(), dq.view().reshape({T * H, Dh}),
                      a.q_pre.view().reshape({T * H, Dh}), env.weights.ones(), a.rstd_q.view());
  const Tensor dq_rows = dq_pre.view().reshape({T, H * Dh});
  k::gemm_dyw(ctx, dqr.view(), dq_rows, p.wq_b);
  if (lora.w) lora_backward(ctx, dqr.view(), dq_rows, a.qr.view(), lora.w->wq_b, lora.g->wq_b, lora.s);
  weight_grad(ctx, g.wq_b, dq_rows, a.qr.view(), q.wq_b);
  k::rmsnorm_backward(ctx, dqa.view(), g.q_a_norm, dqr.view(), a.qa.view(), p.q_a_norm, a.rstd_qa.view());
  k::gemm_dyw(ctx, da, dqa.view(), p.wq_a);
  if (lora.w) lora_backward(ctx, da, dqa.view(), a.a.view(), lora.w->wq_a, lora.g->wq_a, lora.s);
  weight_grad(ctx, g.wq_a, dqa.view(), a.a.view(), q.wq_a);
  // The window key = value of each token.
  OwnedTensor dkv = device_tensor(env.ctx, f32, {T, 1, Dh}), dkv_pre = device_tensor(env.ctx, f32, {T, Dh});
  load_rows(ctx, dkv.view().reshape({T, Dh}), dstore.view(), env.vb.slots, 2, 0);
  k::rope_interleaved_inverse(ctx, rope_tail(dkv.view(), Dr), positions, rope);
  k::rmsnorm_backward(ctx, dkv_pre.view(), g.kv_norm, dkv.view().reshape({T, Dh}), a.kv_pre.view(), p.kv_norm,
                      a.rstd_kv.view());
  k::gemm_dyw(ctx, da, dkv_pre.view(), p.wkv, true);
  if (lora.w) lora_backward(ctx, da, dkv_pre.view(), a.a.view(), lora.w->wkv, lora.g->wkv, lora.s);
  weight_grad(ctx, g.wkv, dkv_pre.view(), a.a.view(), q.wkv);
  if (c.compress_ratio(l) > 0) compressor_backward(env, l, a, dstore.view(), da);
  if (c.compress_ratio(l) == 4 && env.saved.indexer_loss_scale != 0)
    indexer_backward(env, l, a, env.saved.indexer_loss_scale);
}

// One mHC site's backward: du (the sublayer input's gradient) through the
// pre-mix, and the mixing values' gradients, into dx (+=).
void mix_backward(const V4BackEnv& env, Tensor dx, const Tensor& du, const Tensor& dpost, const Tensor& dcomb,
                  const Tensor& x, const MhcSaved& mix, const Tensor& fn, const Tensor& base, const Tensor& scale,
                  const Tensor& dfn, const Tensor& dbase, const Tensor& dscale) {
  const int64_t n = env.c.hc_mult;
  OwnedTensor dpre = device_tensor(env.ctx, f32, {env.T, n});
  k::mhc_pre_apply_backward(env.ctx, dx, dpre.view(), du, x, mix.pre.view(), int(n));
  k::mhc_mix_backward(env.ctx, dx, dfn, dbase, dscale, dpre.view(), dpost, dcomb, x, mix.view(), fn, base, scale,
                      mhc_config(env.c));
}

// dx_in (T, n*D) written from dx_out (T, n*D), the gradient of layer l's output.
void layer_backward(const V4BackEnv& env, int64_t l, const V4LayerActivations& a, const Tensor& dx_out,
                    Tensor dx_in) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t T = env.T, D = c.hidden_size, n = c.hc_mult;
  const LayerParams& p = block_params(env.p, l);
  const LayerParams& g = block_params(env.g, l);
  OwnedTensor dmid = device_tensor(env.ctx, f32, {T, n * D}), df = device_tensor(env.ctx, f32, {T, D}),
              dpost = device_tensor(env.ctx, f32, {T, n}), dcomb = device_tensor(env.ctx, f32, {T, n, n}),
              dz = device_tensor(env.ctx, f32, {T, D}), du = device_tensor(env.ctx, f32, {T, D});
  // The MoE sublayer.
  k::mhc_post_backward(ctx, dmid.view(), df.view(), dpost.view(), dcomb.view(), dx_out, a.f_ffn.view(),
                       a.x_mid.view(), a.mix_ffn.post.view(), a.mix_ffn.comb.view(), int(n));
  moe_backward(env, l, a, df.view(), dz.view());
  k::rmsnorm_backward(ctx, du.view(), g.mlp_norm, dz.view(), a.u_ffn.view(), p.mlp_norm, a.rstd_ffn.view());
  mix_backward(env, dmid.view(), du.view(), dpost.view(), dcomb.view(), a.x_mid.view(), a.mix_ffn, p.hc_ffn_fn,
               p.hc_ffn_base, p.hc_ffn_scale, g.hc_ffn_fn, g.hc_ffn_base, g.hc_ffn_scale);
  // The attention sublayer.
  k::mhc_post_backward(ctx, dx_in, df.view(), dpost.view(), dcomb.view(), dmid.view(), a.f_attn.view(),
                       a.x_in.view(), a.mix_attn.post.view(), a.mix_attn.comb.view(), int(n));
  attention_backward(env, l, a, df.view(), dz.view());
  k::rmsnorm_backward(ctx, du.view(), g.attn_norm, dz.view(), a.u_attn.view(), p.attn_norm, a.rstd_attn.view());
  mix_backward(env, dx_in, du.view(), dpost.view(), dcomb.view(), a.x_in.view(), a.mix_attn, p.hc_attn_fn,
               p.hc_attn_base, p.hc_attn_scale, g.hc_attn_fn, g.hc_attn_base, g.hc_attn_scale);
}

// The parameters and gradients of one head (the main one, or an MTP block's).
struct HeadTensors {
  const Tensor &fn, &base, &scale, &norm;     // the weights backward multiplies by
  const Tensor &dfn, &dbase, &dscale, &dnorm;  // their gradients
};

// dx (T, n*D) written: a head's gradient on the logit rows, 0 elsewhere
// (lm_head's gradient accumulated too). dhead: dlogits is the gradient of the
// normed rows (R, D) instead, lm_head's backward already taken.
void head_backward(const V4BackEnv& env, const RaggedBatch& batch, const V4HeadActivations& s,
                   const HeadTensors& w, const Tensor& dlogits, Tensor dx, bool dhead = false) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t R = int64_t(batch.logit_rows.size()), D = c.hidden_size, n = c.hc_mult;
  zero_tensor(env.ctx, dx);
  if (R == 0) return;
  OwnedTensor dnormed = device_tensor(env.ctx, f32, {dhead ? 0 : R, D}),
              dh = device_tensor(env.ctx, f32, {R, D}), drows = device_tensor(env.ctx, f32, {R, n * D});
  if (!dhead) {
    k::gemm_dyw(ctx, dnormed.view(), dlogits, env.p.lm_head);
    weight_grad(ctx, env.g.lm_head, dlogits, s.normed_rows.view(), env.weights.lm_head());
  }
  k::rmsnorm_backward(ctx, dh.view(), w.dnorm, dhead ? dlogits : dnormed.view(), s.h_rows.view(), w.norm,
                      s.rstd_f.view());
  zero_tensor(env.ctx, drows.view());
  k::mhc_head_backward(ctx, drows.view(), w.dfn, w.dbase, w.dscale, dh.view(), s.x_rows.view(), s.head_w.view(),
                       s.head_raw.view(), s.head_rstd.view(), w.fn, w.base, w.scale, mhc_config(c));
  scatter_rows(ctx, dx, drows.view(), batch.logit_rows);
}

// The MTP blocks' backward, last depth first: each block's head and block,
// its input projections and norms, into the embedding's gradient and the
// gradient of the main model's final streams (dx_main, written).
void mtp_backward(const V4BackEnv& env, const RaggedBatch& batch, const V4Activations& s,
                  const std::vector<Tensor>& dmtp_logits, Tensor dx_main) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t T = env.T, D = c.hidden_size, n = c.hc_mult, L = c.num_layers;
  LS_CHECK(dmtp_logits.size() == s.mtp.size()) << "backward: " << dmtp_logits.size() << " MTP logit gradients for "
                                               << s.mtp.size() << " MTP blocks run by the forward";
  OwnedTensor dh_next = device_tensor(env.ctx, f32, {T, n * D}),
              dx_out = device_tensor(env.ctx, f32, {T, n * D}), dx0 = device_tensor(env.ctx, f32, {T, n * D}),
              dpe = device_tensor(env.ctx, f32, {T, D}), den = device_tensor(env.ctx, f32, {T, D}),
              de = device_tensor(env.ctx, f32, {T, D}), dhn = device_tensor(env.ctx, f32, {T * n, D});
  zero_tensor(env.ctx, dh_next.view());
  for (size_t jj = s.mtp.size(); jj-- > 0;) {
    const V4MtpActivations& m = s.mtp[jj];
    const MtpParams& p = env.p.mtp[jj];
    const MtpParams& g = env.g.mtp[jj];
    head_backward(env, batch, m.head,
                  {p.hc_head_fn, p.hc_head_base, p.hc_head_scale, p.norm, g.hc_head_fn, g.hc_head_base,
                   g.hc_head_scale, g.norm},
                  dmtp_logits[jj], dx_out.view());
    add_into(ctx, dx_out.view(), dx_out.view(), dh_next.view());
    layer_backward(env, L + int64_t(jj), m.block, dx_out.view(), dx0.view());
    // x0 = h_proj(hn) on every stream + e_proj(en) broadcast over the streams.
    sum_streams(ctx, dpe.view(), dx0.view(), n);
    const Tensor dph = dx0.view().reshape({T * n, D});
    k::gemm_dyw(ctx, den.view(), dpe.view(), p.e_proj);
    project_dw(ctx, g.e_proj, dpe.view(), m.en.view(), env.weights.mtp(int64_t(jj)).e_proj);
    k::gemm_dyw(ctx, dhn.view(), dph, p.h_proj);
    project_dw(ctx, g.h_proj, dph, m.hn.view(), env.weights.mtp(int64_t(jj)).h_proj);
    k::rmsnorm_backward(ctx, de.view(), g.enorm, den.view(), m.e.view(), p.enorm, m.rstd_e.view());
    k::embedding_backward(ctx, env.g.embed, de.view(), m.next_t.view());
    k::rmsnorm_backward(ctx, dh_next.view().reshape({T * n, D}), g.hnorm, dhn.view(),
                        m.h_in.view().reshape({T * n, D}), p.hnorm, m.rstd_h.view());
  }
  if (T > 0) k::device_memory(ctx).copy(dx_main.data, dh_next.view().data, dx_main.nbytes());
}

}  // namespace

void v4_backward(const Context& ctx, const ModelWeights& weights, const KvCache& kv, const RaggedBatch& batch,
                 Activations& saved, const Tensor& dlogits, bool dhead, const ModelParams& grads,
                 const std::vector<Tensor>& dmtp_logits) {
  const ModelConfig& c = weights.config();
  for (int32_t n : batch.n_ctx) LS_CHECK(n == 0) << "backward needs a batch with every token new (n_ctx == 0)";
  LS_CHECK(saved.v4 && saved.v4->layers.size() == size_t(c.num_layers)) << "no saved activations for this batch";
  const int64_t T = batch.num_tokens(), D = c.hidden_size, n = c.hc_mult;
  check_shape(dlogits, {int64_t(batch.logit_rows.size()), dhead ? D : c.vocab_size},
              dhead ? "dhead_input" : "dlogits");
  const V4Batch vb(ctx, batch, kv.block_size());
  const V4BackEnv env{ctx, c, weights, weights.backward_params(), grads, kv, vb, T, saved, batch};
  const V4Activations& s = *saved.v4;
  OwnedTensor dx = device_tensor(env.ctx, f32, {T, n * D}), dprev = device_tensor(env.ctx, f32, {T, n * D});
  const ModelParams &p = env.p, &g = env.g;
  head_backward(env, batch, s.head,
                {p.hc_head_fn, p.hc_head_base, p.hc_head_scale, p.final_norm, g.hc_head_fn, g.hc_head_base,
                 g.hc_head_scale, g.final_norm},
                dlogits, dx.view(), dhead);
  if (!dmtp_logits.empty() || !s.mtp.empty()) {
    mtp_backward(env, batch, s, dmtp_logits, dprev.view());
    add_into(ctx, dx.view(), dx.view(), dprev.view());
  }
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    layer_backward(env, l, s.layers[size_t(l)], dx.view(), dprev.view());
    std::swap(dx, dprev);
  }
  OwnedTensor de = device_tensor(env.ctx, f32, {T, D});
  sum_streams(ctx, de.view(), dx.view(), n);
  if (grads.embed.data != nullptr) k::embedding_backward(ctx, grads.embed, de.view(), vb.tokens_t.view());
}

}  // namespace lockstep::model
