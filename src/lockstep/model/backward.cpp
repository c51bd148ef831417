// Backward of the transformer forward for the training case (every token new).
// Activation gradients are written, parameter gradients accumulated (+=) in
// token order, so the result is a pure function of the batch.
#include <algorithm>
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/embedding.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/kernels/cpu/rmsnorm.h"
#include "lockstep/kernels/cpu/rope.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/forward_util.h"
#include "lockstep/model/v4_forward.h"

namespace lockstep::model {

namespace k = lockstep::kernels;

namespace {

// A projection's weight gradient, skipped for a frozen weight (an empty
// gradient view: a LoRA trainer's base, where skipping it is the saving).
void weight_grad(const Context& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                 const kernels::PackedWeight& pw) {
  if (dw.data != nullptr) project_dw(ctx, dw, dy, x, pw);
}
void weight_grad(const Context& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  if (dw.data != nullptr) k::gemm_dytx(ctx, dw, dy, x);
}

// The LoRA adapters of layer l and their gradients (null without LoRA).
struct LayerLora {
  const LoraLayer* w = nullptr;
  const LoraLayer* g = nullptr;
  float s = 0.0f;
  LayerLora(const ModelWeights& weights, const Activations& saved, int64_t l) {
    if (weights.lora() == nullptr) return;
    LS_CHECK(saved.lora_grads != nullptr)
        << "backward: the weights carry LoRA adapters, no gradient was given";
    w = &weights.lora()->params.layers[size_t(l)];
    g = &saved.lora_grads->layers[size_t(l)];
    s = weights.lora()->scale();
  }
};

// Backward of y = down(silu(gate(x)) * up(x)) for rows x (N, D).
// dx (N, D) is written (or accumulated when accumulate), parameter grads +=.
// dact (N, F) and dgu (N, 2F) are scratch.
// pw: the packed weights the forward ran (project_dw takes fp8's quantized inputs).
// lora, lg (null without adapters): the MLP's adapters and their gradients.
void mlp_backward(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& x, const Tensor& gu,
                  const Tensor& act, const MlpParams& w, const MlpParams& g, const PackedMlp& pw,
                  bool accumulate, Tensor dact, Tensor dgu, const LoraMlp* lora = nullptr,
                  const LoraMlp* lg = nullptr, float lora_s = 0.0f) {
  const int64_t F = act.dim(1);
  k::gemm_dyw(ctx, dact, dy, w.w_down);          // dact = dy · Wd   (N,F) = (N,D)(D,F)
  weight_grad(ctx, g.w_down, dy, act, pw.down);  // dWd += dyᵀ act   (D,F)
  if (lora) lora_backward(ctx, dact, dy, act, lora->down, lg->down, lora_s);
  k::swiglu_backward(ctx, dgu.slice_cols(0, F), dgu.slice_cols(F, 2 * F), dact, gu.slice_cols(0, F),
                     gu.slice_cols(F, 2 * F));
  k::gemm_dyw(ctx, dx, dgu, w.w_gate_up, accumulate);  // dx = dgu · Wgu  (N,D)
  weight_grad(ctx, g.w_gate_up, dgu, x, pw.gate_up);   // dWgu += dguᵀ x  (2F,D)
  if (lora) {
    lora_backward(ctx, dx, dgu.slice_cols(0, F), x, lora->gate, lg->gate, lora_s);
    lora_backward(ctx, dx, dgu.slice_cols(F, 2 * F), x, lora->up, lg->up, lora_s);
  }
}

void zero(const Context& ctx, Tensor t) {
  // Device memory is zeroed by its allocator (the host cannot write it).
  const Allocator& memory = kernels::device_memory(ctx);
  if (!memory.host_visible()) return memory.fill(t.data, 0, t.nbytes());
  const int64_t rows = t.dim(0), row_bytes = int64_t(t.nbytes()) / std::max<int64_t>(rows, 1);
  ctx.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    std::memset(static_cast<char*>(t.data) + r0 * row_bytes, 0, size_t((r1 - r0) * row_bytes));
  }, 256);
}

// Temporaries live in the workspace's slots (see forward.cpp). dhead: the
// gradient is that of the head input (R, D), lm_head's backward done.
void backward_impl(const Context& ctx, const ModelWeights& weights, const KvCache& kv, Workspace& ws,
                   const RaggedBatch& batch, Activations& saved, const Tensor& dlogits, bool dhead,
                   const ModelParams& grads, const std::vector<Tensor>& dmtp_logits) {
  const ModelConfig& c = weights.config();
  if (c.is_v4()) {
    v4_backward(ctx, weights, kv, batch, saved, dlogits, dhead, grads, dmtp_logits);
    return;
  }
  LS_CHECK(dmtp_logits.empty()) << "MTP logits gradients for a model without MTP blocks";
  const ModelParams& p = weights.backward_params();  // the quantized weights in bf16/fp8 (straight-through)
  for (int32_t n : batch.n_ctx) LS_CHECK(n == 0) << "backward needs a batch with every token new (n_ctx == 0)";
  const int64_t T = batch.num_tokens(), D = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads,
                Dh = c.head_dim, R = static_cast<int64_t>(batch.logit_rows.size());
  check_shape(dlogits, {R, dhead ? D : c.vocab_size}, dhead ? "dhead_input" : "dlogits");
  LS_CHECK(saved.layers.size() == size_t(c.num_layers)) << "no saved activations for this batch";
  LS_CHECK(saved.recompute || !kv.shared_layers())
      << "backward on a K/V cache shared by all layers needs the forward's recompute (only it rewrites a "
         "layer's keys and values)";
  BatchTensors bt(batch, kv.block_size(), kernels::device_memory(ctx));
  const k::AttentionBatch ab = bt.attention_batch();
  const DType f32 = DType::F32;

  // Backward's buffers take the slots of forward scratch that nothing reads
  // once the forward (or a layer's recompute) is past it: the last layer's
  // output (kSlotX), qkv, the new K/V and the FFN output (the recompute
  // fills them again with the same shapes, so these views stay valid).
  // Vocabulary projection and final norm: only the logit rows carry gradient.
  Tensor dx = ws.get(kSlotX, f32, {T, D});  // gradient w.r.t. the residual stream
  if (R > 0) {
    Tensor dnormed_rows = dlogits, drows = ws.get(kSlotRows, f32, {R, D});
    if (!dhead) {
      dnormed_rows = ws.get(kSlotRowsNormed, f32, {R, D});
      k::gemm_dyw(ctx, dnormed_rows, dlogits, p.lm_head);
      weight_grad(ctx, grads.lm_head, dlogits, saved.normed_rows.view(), weights.lm_head());
    }
    k::rmsnorm_backward(ctx, drows, grads.final_norm, dnormed_rows, saved.x_final.view(), p.final_norm,
                        saved.rstd_f.view());
    scatter_rows(ctx, dx, drows, batch.logit_rows);
  } else {
    zero(ctx, dx);
  }

  Tensor dnormed = ws.get(kSlotDnormed, f32, {T, D}), dtmp = ws.get(kSlotFfn, f32, {T, D}),
         dh = ws.get(kSlotDh, f32, {T, D});
  Tensor dk = ws.get(kSlotK, f32, {T, Hkv, Dh}), dv = ws.get(kSlotV, f32, {T, Hkv, Dh}),
         dqkv = ws.get(kSlotQkv, f32, {T, (H + 2 * Hkv) * Dh});
  const float scale = attention_scale(c);

  // Recompute mode: the layer's forward again from its saved input, with the
  // same kernels and routing (replay included), so the same bits.
  ForwardOptions ro;
  ro.replay_experts = saved.replay.empty() ? nullptr : &saved.replay;
  ro.experts = saved.experts;
  ForwardResult rr;
  const int64_t n_moe = c.num_moe_layers();
  int64_t moe_index = n_moe;
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    const LayerParams& w = p.layers[size_t(l)];
    const LayerParams& g = grads.layers[size_t(l)];
    if (w.is_moe) --moe_index;
    if (saved.recompute) recompute_layer(ctx, weights, kv, ws, batch, bt, ro, &rr, l, moe_index, saved);
    const LayerActivations& a = saved.layers[size_t(l)];
    const PackedLayer& q = weights.layer(l);
    const LayerLora lora(weights, saved, l);
    // x_out = h + ffn(normed2): both branches receive dx.

    // FFN backward into dnormed (= d normed2).
    if (!w.is_moe) {
      const int64_t F = c.intermediate_size;
      mlp_backward(ctx, dnormed, dx, a.normed2.view(), a.gu.view(), a.act.view(), w.mlp, g.mlp, q.mlp, false,
                   ws.get(kSlotDact, f32, {T, F}), ws.get(kSlotDgu, f32, {T, 2 * F}),
                   lora.w ? &lora.w->mlp : nullptr, lora.g ? &lora.g->mlp : nullptr, lora.s);
    } else {
      const int64_t E = c.num_experts, K = c.num_experts_per_tok, Fe = c.moe_intermediate_size;
      zero(ctx, dnormed);
      Tensor dye = ws.get(kSlotDye, f32, {T * K, D}), dtopk_w = ws.get(kSlotDtopkW, f32, {T, K}),
             dxe = ws.get(kSlotDxe, f32, {T * K, D});
      k::moe_combine_backward(ctx, dye, dtopk_w, dx, a.ye.view(), a.topk_w.view(), a.plan);
      // Expert rows: this rank's own, or (expert parallelism) the group's
      // rows of this rank's experts, whose output gradients travel the
      // forward's route and whose input gradients travel back.
      const bool ep = saved.experts != nullptr;
      const kernels::MoeDispatch& rows = ep ? a.route.local : a.plan;
      const int64_t N = ep ? a.route.num_in() : T * K;
      Tensor dyr = dye, dxr = dxe, stage;
      if (ep) {
        dyr = ws.get(kSlotDyr, f32, {N, D});
        dxr = ws.get(kSlotDxr, f32, {N, D});
        stage = ws.get(kSlotEpStage, f32, {N, D});
        expert_dispatch(ctx, *saved.experts, a.route, dye, dyr, stage);
      }
      Tensor dact = ws.get(kSlotDact, f32, {N, Fe}), dgu = ws.get(kSlotDgu, f32, {N, 2 * Fe});
      // Experts own disjoint rows of every buffer and their own gradients.
      const auto expert_rows = [&](int64_t e, int64_t r0, int64_t r1, const Context& ectx) {
        mlp_backward(ectx, dxr.slice_rows(r0, r1), dyr.slice_rows(r0, r1), a.xe.view().slice_rows(r0, r1),
                     a.gu_e.view().slice_rows(r0, r1), a.act_e.view().slice_rows(r0, r1),
                     w.experts[size_t(e)], g.experts[size_t(e)], q.experts[size_t(e)], false,
                     dact.slice_rows(r0, r1), dgu.slice_rows(r0, r1), lora_expert(lora.w, e),
                     lora_expert(lora.g, e), lora.s);
      };
      const bool per_source = ep && saved.fold_expert_grads;
      for_each_expert(ctx, rows, [&](int64_t e, const Context& ectx) {
        const int64_t r0 = rows.offsets[size_t(e)], r1 = rows.offsets[size_t(e) + 1];
        if (!per_source) return expert_rows(e, r0, r1, ectx);
        // Each source's rows (one micro-batch of that rank) in turn, from zero.
        const int64_t P = a.route.ranks();
        for (int64_t src = 0, s0 = r0; src < P; ++src) {
          const int64_t s1 = s0 + a.route.by_source[size_t(e * P + src)];
          if (s1 > s0) {
            expert_rows(e, s0, s1, ectx);
            saved.fold_expert_grads(g.experts[size_t(e)], ectx);
          }
          s0 = s1;
        }
      });
      if (ep) expert_return(ctx, *saved.experts, a.route, dxr, dxe, stage);
      k::moe_gather_backward(ctx, dnormed, dxe, a.plan);
      // Router: d logits from d topk_w, then through the router projection.
      Tensor dlog = ws.get(kSlotDlog, f32, {T, E});
      k::moe_route_backward(ctx, dlog, dtopk_w, a.scores.view(), a.topk_idx.view(), router_config(c));
      k::gemm_dyw(ctx, dnormed, dlog, w.router, true);
      weight_grad(ctx, g.router, dlog, a.normed2.view());
      if (c.has_shared_expert()) {
        const int64_t Fs = c.shared_expert_intermediate_size;
        Tensor dys = dx;
        if (c.shared_expert_gate) {
          // ffn += ys * s, s = sigmoid(normed2 · wg): dys = dx * s; ds = <dx, ys>; dlogit = ds * s * (1 - s).
          dys = ws.get(kSlotDys, f32, {T, D});
          Tensor dglogit = ws.get(kSlotDglogit, f32, {T, 1});
          const float *dxp = dx.f32(), *ysp = a.ys.f32(), *sp = a.sgate.f32();
          float *dysp = dys.f32(), *dgp = dglogit.f32();
          ctx.parallel_for(T, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) {
              const float s = sp[t];
              float ds = 0.0f;
              for (int64_t d = 0; d < D; ++d) {
                dysp[t * D + d] = dxp[t * D + d] * s;
                ds = ds + dxp[t * D + d] * ysp[t * D + d];
              }
              dgp[t] = ds * s * (1.0f - s);
            }
          });
          k::gemm_dyw(ctx, dnormed, dglogit, w.shared_gate, true);
          weight_grad(ctx, g.shared_gate, dglogit, a.normed2.view());
        }
        mlp_backward(ctx, dnormed, dys, a.normed2.view(), a.gu_s.view(), a.act_s.view(), w.shared, g.shared,
                     q.shared, true, ws.get(kSlotDact, f32, {T, Fs}), ws.get(kSlotDgu, f32, {T, 2 * Fs}),
                     lora.w ? &lora.w->shared : nullptr, lora.g ? &lora.g->shared : nullptr, lora.s);
      }
    }
    // normed2 = rmsnorm(h): dh = dx + rmsnorm_backward(dnormed).
    k::rmsnorm_backward(ctx, dtmp, g.mlp_norm, dnormed, a.h.view(), w.mlp_norm, a.rstd2.view());
    add_into(ctx, dh, dx, dtmp);

    // h = x_in + attn · Woᵀ. The attention's gradients take the FFN
    // backward's slots (dead by now): dattn and then dq_pre kSlotDact, dq
    // and then dk_pre kSlotDgu, each after the last read of the one before.
    Tensor dattn = ws.get(kSlotDact, f32, {T, H * Dh}), dq = ws.get(kSlotDgu, f32, {T, H, Dh});
    k::gemm_dyw(ctx, dattn, dh, w.wo);
    weight_grad(ctx, g.wo, dh, a.attn.view(), q.wo);
    if (lora.w) lora_backward(ctx, dattn, dh, a.attn.view(), lora.w->o, lora.g->o, lora.s);
    k::attention_backward(ctx, dq, dk, dv, dattn.reshape({T, H, Dh}), a.attn.view().reshape({T, H, Dh}),
                          a.lse.view(), a.q.view(), kv.k(l), kv.v(l), ab, scale);
    k::rope_backward(ctx, dq, bt.positions_t.view(), weights.rope());
    k::rope_backward(ctx, dk, bt.positions_t.view(), weights.rope());
    if (c.qk_norm) {
      Tensor dq_pre = ws.get(kSlotDact, f32, {T, H, Dh});
      k::rmsnorm_backward(ctx, dq_pre.reshape({T * H, Dh}), g.q_norm, dq.reshape({T * H, Dh}),
                          a.q_pre.view().reshape({T * H, Dh}), w.q_norm, a.rstd_q.view());
      Tensor dk_pre = ws.get(kSlotDgu, f32, {T, Hkv, Dh});
      k::rmsnorm_backward(ctx, dk_pre.reshape({T * Hkv, Dh}), g.k_norm, dk.reshape({T * Hkv, Dh}),
                          a.k_pre.view().reshape({T * Hkv, Dh}), w.k_norm, a.rstd_k.view());
      join_qkv(ctx, dqkv, dq_pre, dk_pre, dv);
    } else {
      join_qkv(ctx, dqkv, dq, dk, dv);
    }
    if (c.qkv_bias && g.bqkv.data != nullptr) add_column_sums(ctx, g.bqkv, dqkv);
    k::gemm_dyw(ctx, dnormed, dqkv, w.wqkv);
    weight_grad(ctx, g.wqkv, dqkv, a.normed1.view(), q.wqkv);
    if (lora.w) {
      const int64_t nq = H * Dh, nk = Hkv * Dh;
      const Tensor x1 = a.normed1.view();
      lora_backward(ctx, dnormed, dqkv.slice_cols(0, nq), x1, lora.w->q, lora.g->q, lora.s);
      lora_backward(ctx, dnormed, dqkv.slice_cols(nq, nq + nk), x1, lora.w->k, lora.g->k, lora.s);
      lora_backward(ctx, dnormed, dqkv.slice_cols(nq + nk, nq + 2 * nk), x1, lora.w->v, lora.g->v, lora.s);
    }
    // normed1 = rmsnorm(x_in): dx = dh + rmsnorm_backward(dnormed).
    k::rmsnorm_backward(ctx, dtmp, g.attn_norm, dnormed, a.x_in.view(), w.attn_norm, a.rstd1.view());
    add_into(ctx, dx, dh, dtmp);
    if (saved.recompute) {  // hand the buffers down to the next layer's recompute
      if (l > 0)
        pass_layer_buffers(saved.layers[size_t(l)], saved.layers[size_t(l) - 1]);
      else
        drop_layer(saved.layers[0]);
    }
  }
  if (grads.embed.data != nullptr) k::embedding_backward(ctx, grads.embed, dx, bt.tokens.view());
}

}  // namespace

void lm_head_backward_dx(const Context& ctx, const ModelWeights& weights, Tensor dx, const Tensor& dlogits) {
  k::gemm_dyw(ctx, dx, dlogits, weights.backward_params().lm_head);
}

void lm_head_backward_dw(const Context& ctx, const ModelWeights& weights, const ModelParams& grads,
                         const Tensor& dlogits, const Tensor& rows, int64_t v0) {
  const int64_t W = dlogits.dim(1);
  LS_CHECK(v0 >= 0 && v0 + W <= weights.config().vocab_size)
      << "lm_head_backward_dw: columns [" << v0 << ", " << v0 + W << ") outside the vocabulary";
  project_dw(ctx, grads.lm_head.slice_rows(v0, v0 + W), dlogits, rows, weights.lm_head());
}

void backward(const Context& ctx, const ModelWeights& weights, const KvCache& kv, Workspace& ws,
              const RaggedBatch& batch, Activations& saved, const Tensor& dlogits, const ModelParams& grads,
              const std::vector<Tensor>& dmtp_logits) {
  backward_impl(ctx, weights, kv, ws, batch, saved, dlogits, false, grads, dmtp_logits);
}

void backward_from_head_input(const Context& ctx, const ModelWeights& weights, const KvCache& kv,
                              Workspace& ws, const RaggedBatch& batch, Activations& saved,
                              const Tensor& dhead_input, const ModelParams& grads,
                              const std::vector<Tensor>& dmtp_logits) {
  backward_impl(ctx, weights, kv, ws, batch, saved, dhead_input, true, grads, dmtp_logits);
}

}  // namespace lockstep::model
