// Transformer forward over a ragged batch with a paged KV cache. One code path
// for prefill, decode and the trainer: only the batch differs.
#include "lockstep/model/forward.h"

#include <cmath>
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/embedding.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/rmsnorm.h"
#include "lockstep/kernels/cpu/rope.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/model/forward_util.h"

namespace lockstep::model {

namespace k = lockstep::kernels;

float attention_scale(const ModelConfig& c) { return static_cast<float>(1.0 / std::sqrt(double(c.head_dim))); }

void RaggedBatch::validate(const ModelConfig& c, const KvCache& kv) const {
  const int64_t S = num_seqs();
  if (static_cast<int64_t>(n_ctx.size()) != S)
    LS_THROW << "batch: n_ctx has " << n_ctx.size() << " entries, n_new has " << S;
  if (static_cast<int64_t>(block_table.size()) != S * max_blocks)
    LS_THROW << "batch: block_table has " << block_table.size() << " entries, expected S*max_blocks = " << S
             << "*" << max_blocks;
  int64_t t = 0;
  for (int64_t i = 0; i < S; ++i) {
    if (n_new[i] < 0 || n_ctx[i] < 0) LS_THROW << "batch: sequence " << i << " has negative n_new/n_ctx";
    t += n_new[i];
    if (int64_t(n_ctx[i]) + n_new[i] > int64_t(max_blocks) * kv.block_size())
      LS_THROW << "batch: sequence " << i << " needs " << n_ctx[i] + n_new[i] << " positions, its block table holds "
               << int64_t(max_blocks) * kv.block_size();
    if (int64_t(n_ctx[i]) + n_new[i] > c.max_position_embeddings)
      LS_THROW << "batch: sequence " << i << " reaches position " << n_ctx[i] + n_new[i]
               << ", beyond max_position_embeddings " << c.max_position_embeddings;
  }
  if (t != num_tokens()) LS_THROW << "batch: sum(n_new) = " << t << " but " << num_tokens() << " tokens given";
  for (int32_t tok : tokens)
    if (tok < 0 || tok >= c.vocab_size) LS_THROW << "batch: token id " << tok << " outside [0, " << c.vocab_size << ")";
  for (size_t r = 0; r < logit_rows.size(); ++r) {
    if (logit_rows[r] < 0 || logit_rows[r] >= t || (r > 0 && logit_rows[r] <= logit_rows[r - 1]))
      LS_THROW << "batch: logit_rows must be ascending rows of [0, " << t << "), got " << logit_rows[r] << " at " << r;
  }
}

namespace {

// Runs one SwiGLU FFN on rows x (N, D): gu (N, 2F) = x·[Wg;Wu]ᵀ, act = silu(g)*u, y = act·Wdᵀ.
void mlp_forward(const Context& ctx, Tensor y, Tensor gu, Tensor act, const Tensor& x, const PackedMlp& w,
                 bool accumulate) {
  const int64_t F = act.dim(1);
  k::gemm_xwt(ctx, gu, x, w.gate_up);
  k::swiglu_forward(ctx, act, gu.slice_cols(0, F), gu.slice_cols(F, 2 * F));
  k::gemm_xwt(ctx, y, act, w.down, accumulate);
}

}  // namespace

void forward(const Context& ctx, const ModelWeights& weights, KvCache& kv, const RaggedBatch& batch,
             const ForwardOptions& opt, ForwardResult* result, Activations* saved) {
  const ModelConfig& c = weights.config();
  batch.validate(c, kv);
  LS_CHECK(!opt.save_activations || saved != nullptr) << "save_activations needs an Activations";
  const int64_t T = batch.num_tokens(), D = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads,
                Dh = c.head_dim, R = static_cast<int64_t>(batch.logit_rows.size());
  const int64_t QKV = (H + 2 * Hkv) * Dh;
  const bool save = opt.save_activations;
  const int64_t n_moe = count_moe_layers(c);
  const int64_t K = c.num_experts_per_tok;
  if (opt.replay_experts != nullptr) {
    LS_CHECK(static_cast<int64_t>(opt.replay_experts->size()) == T * n_moe * K)
        << "replay_experts has " << opt.replay_experts->size() << " entries, expected T*L_moe*K = " << T << "*"
        << n_moe << "*" << K;
  }
  if (opt.record_experts) result->routed_experts.assign(static_cast<size_t>(T * n_moe * K), 0);

  BatchTensors bt(batch, kv.block_size());
  if (save) {
    saved->layers.clear();
    saved->layers.resize(static_cast<size_t>(c.num_layers));
    saved->positions = bt.positions;
  }

  // Residual stream.
  OwnedTensor x(DType::F32, {T, D});
  k::embedding_forward(ctx, x.view(), weights.params().embed, bt.tokens.view());

  OwnedTensor normed(DType::F32, {T, D}), rstd(DType::F32, {T}), qkv(DType::F32, {T, QKV});
  OwnedTensor q(DType::F32, {T, H, Dh}), kn(DType::F32, {T, Hkv, Dh}), vn(DType::F32, {T, Hkv, Dh});
  OwnedTensor attn(DType::F32, {T, H * Dh}), lse(DType::F32, {T, H}), h(DType::F32, {T, D});
  OwnedTensor ffn(DType::F32, {T, D});
  const float scale = attention_scale(c);
  const k::AttentionBatch ab = bt.attention_batch();

  int64_t moe_index = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerParams& p = weights.params().layers[static_cast<size_t>(l)];
    const PackedLayer& w = weights.layer(l);
    LayerActivations* a = save ? &saved->layers[static_cast<size_t>(l)] : nullptr;
    if (a) a->x_in = copy_of(x.view());

    // Attention block.
    k::rmsnorm_forward(ctx, normed.view(), rstd.view(), x.view(), p.attn_norm, float(c.rms_norm_eps));
    if (a) {
      a->rstd1 = copy_of(rstd.view());
      a->normed1 = copy_of(normed.view());
    }
    k::gemm_xwt(ctx, qkv.view(), normed.view(), w.wqkv);
    if (c.qkv_bias) add_row_bias(ctx, qkv.view(), p.bqkv);
    split_qkv(ctx, q.view(), kn.view(), vn.view(), qkv.view());
    if (c.qk_norm) {
      // Per-head RMSNorm over Dh on the (T*H, Dh) and (T*Hkv, Dh) views.
      OwnedTensor q_pre = copy_of(q.view()), k_pre = copy_of(kn.view());
      OwnedTensor rstd_q(DType::F32, {T * H}), rstd_k(DType::F32, {T * Hkv});
      k::rmsnorm_forward(ctx, q.view().reshape({T * H, Dh}), rstd_q.view(), q_pre.view().reshape({T * H, Dh}),
                         p.q_norm, float(c.rms_norm_eps));
      k::rmsnorm_forward(ctx, kn.view().reshape({T * Hkv, Dh}), rstd_k.view(),
                         k_pre.view().reshape({T * Hkv, Dh}), p.k_norm, float(c.rms_norm_eps));
      if (a) {
        a->q_pre = std::move(q_pre);
        a->k_pre = std::move(k_pre);
        a->rstd_q = std::move(rstd_q);
        a->rstd_k = std::move(rstd_k);
      }
    }
    k::rope_forward(ctx, q.view(), bt.positions_t.view(), weights.rope());
    k::rope_forward(ctx, kn.view(), bt.positions_t.view(), weights.rope());
    k::kv_cache_write(ctx, kv.k(l), kv.v(l), kn.view(), vn.view(), ab);
    k::attention_forward(ctx, attn.view().reshape({T, H, Dh}), save ? lse.view() : Tensor(), q.view(), kv.k(l),
                         kv.v(l), ab, scale);
    if (a) {
      a->q = copy_of(q.view());
      a->attn = copy_of(attn.view());
      a->lse = copy_of(lse.view());
    }
    // h = x + attn·Woᵀ, then normed = rmsnorm(h).
    k::gemm_xwt(ctx, ffn.view(), attn.view(), w.wo);
    k::add_rmsnorm_forward(ctx, normed.view(), h.view(), rstd.view(), x.view(), ffn.view(), p.mlp_norm,
                           float(c.rms_norm_eps));
    if (a) {
      a->h = copy_of(h.view());
      a->rstd2 = copy_of(rstd.view());
      a->normed2 = copy_of(normed.view());
    }

    // FFN block: ffn = FFN(normed).
    if (!p.is_moe) {
      const int64_t F = c.intermediate_size;
      OwnedTensor gu(DType::F32, {T, 2 * F}), act(DType::F32, {T, F});
      mlp_forward(ctx, ffn.view(), gu.view(), act.view(), normed.view(), w.mlp, false);
      if (a) {
        a->gu = std::move(gu);
        a->act = std::move(act);
      }
    } else {
      const int64_t E = c.num_experts, Fe = c.moe_intermediate_size;
      OwnedTensor logits(DType::F32, {T, E}), scores(DType::F32, {T, E});
      OwnedTensor topk_idx(DType::I32, {T, K}), topk_w(DType::F32, {T, K});
      k::gemm_xwt(ctx, logits.view(), normed.view(), w.router);
      OwnedTensor replay;
      if (opt.replay_experts != nullptr) {
        replay = OwnedTensor(DType::I32, {T, K});
        gather_layer_experts(replay.view(), *opt.replay_experts, moe_index, n_moe, K);
      }
      k::moe_route(ctx, topk_idx.view(), topk_w.view(), scores.view(), logits.view(), p.router_bias,
                   replay.view(), router_config(c));
      if (opt.record_experts) scatter_layer_experts(result->routed_experts, topk_idx.view(), moe_index, n_moe, K);
      k::MoeDispatch plan = k::moe_plan(topk_idx.view(), static_cast<int>(E));
      OwnedTensor xe(DType::F32, {T * K, D}), gu_e(DType::F32, {T * K, 2 * Fe}), act_e(DType::F32, {T * K, Fe}),
          ye(DType::F32, {T * K, D});
      k::moe_gather(ctx, xe.view(), normed.view(), plan);
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = plan.offsets[size_t(e)], r1 = plan.offsets[size_t(e) + 1];
        if (r0 == r1) continue;
        mlp_forward(ctx, ye.view().slice_rows(r0, r1), gu_e.view().slice_rows(r0, r1),
                    act_e.view().slice_rows(r0, r1), xe.view().slice_rows(r0, r1), w.experts[size_t(e)], false);
      }
      k::moe_combine(ctx, ffn.view(), ye.view(), topk_w.view(), plan);
      if (c.has_shared_expert()) {
        const int64_t Fs = c.shared_expert_intermediate_size;
        OwnedTensor gu_s(DType::F32, {T, 2 * Fs}), act_s(DType::F32, {T, Fs}), ys(DType::F32, {T, D});
        mlp_forward(ctx, ys.view(), gu_s.view(), act_s.view(), normed.view(), w.shared, false);
        OwnedTensor sgate;
        if (c.shared_expert_gate) {
          sgate = OwnedTensor(DType::F32, {T});
          shared_gate_forward(ctx, sgate.view(), normed.view(), w.shared_gate);
        }
        add_shared_expert(ctx, ffn.view(), ys.view(), sgate.view());
        if (a) {
          a->gu_s = std::move(gu_s);
          a->act_s = std::move(act_s);
          a->ys = std::move(ys);
          a->sgate = std::move(sgate);
        }
      }
      if (a) {
        a->scores = std::move(scores);
        a->topk_idx = std::move(topk_idx);
        a->topk_w = std::move(topk_w);
        a->plan = std::move(plan);
        a->xe = std::move(xe);
        a->gu_e = std::move(gu_e);
        a->act_e = std::move(act_e);
        a->ye = std::move(ye);
      }
      ++moe_index;
    }
    // x = h + ffn (one f32 add per element).
    add_into(ctx, x.view(), h.view(), ffn.view());
  }

  // Final norm on the wanted rows only, then the vocabulary projection.
  OwnedTensor rows(DType::F32, {R, D});
  gather_rows(rows.view(), x.view(), batch.logit_rows);
  OwnedTensor rows_normed(DType::F32, {R, D}), rstd_f(DType::F32, {R});
  k::rmsnorm_forward(ctx, rows_normed.view(), rstd_f.view(), rows.view(), weights.params().final_norm,
                     float(c.rms_norm_eps));
  result->logits = OwnedTensor(DType::F32, {R, c.vocab_size});
  if (R > 0) k::gemm_xwt(ctx, result->logits.view(), rows_normed.view(), weights.lm_head());
  if (save) {
    saved->x_final = std::move(rows);
    saved->rstd_f = std::move(rstd_f);
    saved->normed_rows = std::move(rows_normed);
  }
}

}  // namespace lockstep::model
