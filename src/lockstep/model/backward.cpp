// Backward of the transformer forward for the training case (every token new).
// Activation gradients are written, parameter gradients accumulated (+=) in
// token order, so the result is a pure function of the batch.
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/embedding.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/kernels/cpu/rmsnorm.h"
#include "lockstep/kernels/cpu/rope.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/forward_util.h"

namespace lockstep::model {

namespace k = lockstep::kernels;

namespace {

// Backward of y = down(silu(gate(x)) * up(x)) for rows x (N, D).
// dx (N, D) is written (or accumulated when accumulate), parameter grads +=.
void mlp_backward(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& x, const Tensor& gu,
                  const Tensor& act, const MlpParams& w, const MlpParams& g, bool accumulate) {
  const int64_t N = x.dim(0), F = act.dim(1);
  OwnedTensor dact(DType::F32, {N, F}), dgu(DType::F32, {N, 2 * F});
  k::gemm_dyw(ctx, dact.view(), dy, w.w_down);         // dact = dy · Wd   (N,F) = (N,D)(D,F)
  k::gemm_dytx(ctx, g.w_down, dy, act);                // dWd += dyᵀ act   (D,F)
  k::swiglu_backward(ctx, dgu.view().slice_cols(0, F), dgu.view().slice_cols(F, 2 * F), dact.view(),
                     gu.slice_cols(0, F), gu.slice_cols(F, 2 * F));
  k::gemm_dyw(ctx, dx, dgu.view(), w.w_gate_up, accumulate);  // dx = dgu · Wgu  (N,D)
  k::gemm_dytx(ctx, g.w_gate_up, dgu.view(), x);              // dWgu += dguᵀ x  (2F,D)
}

void zero(Tensor t) { std::memset(t.data, 0, t.nbytes()); }

}  // namespace

void backward(const Context& ctx, const ModelWeights& weights, const KvCache& kv, const RaggedBatch& batch,
              const Activations& saved, const Tensor& dlogits, const ModelParams& grads) {
  const ModelConfig& c = weights.config();
  const ModelParams& p = weights.params();
  for (int32_t n : batch.n_ctx) LS_CHECK(n == 0) << "backward needs a batch with every token new (n_ctx == 0)";
  const int64_t T = batch.num_tokens(), D = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads,
                Dh = c.head_dim, R = static_cast<int64_t>(batch.logit_rows.size());
  check_shape(dlogits, {R, c.vocab_size}, "dlogits");
  LS_CHECK(saved.layers.size() == size_t(c.num_layers)) << "no saved activations for this batch";
  BatchTensors bt(batch, kv.block_size());
  const k::AttentionBatch ab = bt.attention_batch();

  // Vocabulary projection and final norm: only the logit rows carry gradient.
  OwnedTensor dnormed_rows(DType::F32, {R, D}), drows(DType::F32, {R, D});
  OwnedTensor dx(DType::F32, {T, D});  // gradient w.r.t. the residual stream
  if (R > 0) {
    k::gemm_dyw(ctx, dnormed_rows.view(), dlogits, p.lm_head);
    k::gemm_dytx(ctx, grads.lm_head, dlogits, saved.normed_rows.view());
    k::rmsnorm_backward(ctx, drows.view(), grads.final_norm, dnormed_rows.view(), saved.x_final.view(),
                        p.final_norm, saved.rstd_f.view());
    for (int64_t r = 0; r < R; ++r)
      std::memcpy(dx.f32() + int64_t(batch.logit_rows[size_t(r)]) * D, drows.f32() + r * D, size_t(D) * 4);
  }

  OwnedTensor dnormed(DType::F32, {T, D}), dtmp(DType::F32, {T, D}), dh(DType::F32, {T, D});
  OwnedTensor dattn(DType::F32, {T, H * Dh}), dq(DType::F32, {T, H, Dh}), dk(DType::F32, {T, Hkv, Dh}),
      dv(DType::F32, {T, Hkv, Dh}), dqkv(DType::F32, {T, (H + 2 * Hkv) * Dh});
  const float scale = attention_scale(c);

  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    const LayerParams& w = p.layers[size_t(l)];
    const LayerParams& g = grads.layers[size_t(l)];
    const LayerActivations& a = saved.layers[size_t(l)];
    // x_out = h + ffn(normed2): both branches receive dx.
    std::memcpy(dh.f32(), dx.f32(), size_t(T * D) * 4);

    // FFN backward into dnormed (= d normed2).
    if (!w.is_moe) {
      mlp_backward(ctx, dnormed.view(), dx.view(), a.normed2.view(), a.gu.view(), a.act.view(), w.mlp, g.mlp,
                   false);
    } else {
      const int64_t E = c.num_experts, K = c.num_experts_per_tok;
      zero(dnormed.view());
      OwnedTensor dye(DType::F32, {T * K, D}), dtopk_w(DType::F32, {T, K}), dxe(DType::F32, {T * K, D});
      k::moe_combine_backward(ctx, dye.view(), dtopk_w.view(), dx.view(), a.ye.view(), a.topk_w.view(), a.plan);
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = a.plan.offsets[size_t(e)], r1 = a.plan.offsets[size_t(e) + 1];
        if (r0 == r1) continue;
        mlp_backward(ctx, dxe.view().slice_rows(r0, r1), dye.view().slice_rows(r0, r1),
                     a.xe.view().slice_rows(r0, r1), a.gu_e.view().slice_rows(r0, r1),
                     a.act_e.view().slice_rows(r0, r1), w.experts[size_t(e)], g.experts[size_t(e)], false);
      }
      k::moe_gather_backward(ctx, dnormed.view(), dxe.view(), a.plan);
      // Router: d logits from d topk_w, then through the router projection.
      OwnedTensor dlog(DType::F32, {T, E});
      k::moe_route_backward(ctx, dlog.view(), dtopk_w.view(), a.scores.view(), a.topk_idx.view(), router_config(c));
      k::gemm_dyw(ctx, dnormed.view(), dlog.view(), w.router, true);
      k::gemm_dytx(ctx, g.router, dlog.view(), a.normed2.view());
      if (c.has_shared_expert()) {
        OwnedTensor dys(DType::F32, {T, D});
        if (c.shared_expert_gate) {
          // ffn += ys * s, s = sigmoid(normed2 · wg): dys = dx * s; ds = <dx, ys>; dlogit = ds * s * (1 - s).
          OwnedTensor dglogit(DType::F32, {T, 1});
          for (int64_t t = 0; t < T; ++t) {
            const float s = a.sgate.f32()[t];
            float ds = 0.0f;
            for (int64_t d = 0; d < D; ++d) {
              dys.f32()[t * D + d] = dx.f32()[t * D + d] * s;
              ds = ds + dx.f32()[t * D + d] * a.ys.f32()[t * D + d];
            }
            dglogit.f32()[t] = ds * s * (1.0f - s);
          }
          k::gemm_dyw(ctx, dnormed.view(), dglogit.view(), w.shared_gate, true);
          k::gemm_dytx(ctx, g.shared_gate, dglogit.view(), a.normed2.view());
        } else {
          std::memcpy(dys.f32(), dx.f32(), size_t(T * D) * 4);
        }
        mlp_backward(ctx, dnormed.view(), dys.view(), a.normed2.view(), a.gu_s.view(), a.act_s.view(), w.shared,
                     g.shared, true);
      }
    }
    // normed2 = rmsnorm(h): dh += rmsnorm_backward(dnormed).
    k::rmsnorm_backward(ctx, dtmp.view(), g.mlp_norm, dnormed.view(), a.h.view(), w.mlp_norm, a.rstd2.view());
    add_into(ctx, dh.view(), dh.view(), dtmp.view());

    // h = x_in + attn · Woᵀ.
    k::gemm_dyw(ctx, dattn.view(), dh.view(), w.wo);
    k::gemm_dytx(ctx, g.wo, dh.view(), a.attn.view());
    k::attention_backward(ctx, dq.view(), dk.view(), dv.view(), dattn.view().reshape({T, H, Dh}),
                          a.attn.view().reshape({T, H, Dh}), a.lse.view(), a.q.view(), kv.k(l), kv.v(l), ab, scale);
    k::rope_backward(ctx, dq.view(), bt.positions_t.view(), weights.rope());
    k::rope_backward(ctx, dk.view(), bt.positions_t.view(), weights.rope());
    if (c.qk_norm) {
      OwnedTensor dq_pre(DType::F32, {T, H, Dh}), dk_pre(DType::F32, {T, Hkv, Dh});
      k::rmsnorm_backward(ctx, dq_pre.view().reshape({T * H, Dh}), g.q_norm, dq.view().reshape({T * H, Dh}),
                          a.q_pre.view().reshape({T * H, Dh}), w.q_norm, a.rstd_q.view());
      k::rmsnorm_backward(ctx, dk_pre.view().reshape({T * Hkv, Dh}), g.k_norm, dk.view().reshape({T * Hkv, Dh}),
                          a.k_pre.view().reshape({T * Hkv, Dh}), w.k_norm, a.rstd_k.view());
      join_qkv(ctx, dqkv.view(), dq_pre.view(), dk_pre.view(), dv.view());
    } else {
      join_qkv(ctx, dqkv.view(), dq.view(), dk.view(), dv.view());
    }
    if (c.qkv_bias) add_column_sums(ctx, g.bqkv, dqkv.view());
    k::gemm_dyw(ctx, dnormed.view(), dqkv.view(), w.wqkv);
    k::gemm_dytx(ctx, g.wqkv, dqkv.view(), a.normed1.view());
    // normed1 = rmsnorm(x_in): dx = dh + rmsnorm_backward(dnormed).
    k::rmsnorm_backward(ctx, dtmp.view(), g.attn_norm, dnormed.view(), a.x_in.view(), w.attn_norm, a.rstd1.view());
    add_into(ctx, dx.view(), dh.view(), dtmp.view());
  }
  k::embedding_backward(ctx, grads.embed, dx.view(), bt.tokens.view());
}

}  // namespace lockstep::model
