// Transformer forward over a ragged batch with a paged KV cache. One code path
// for prefill, decode and the trainer: only the batch differs.
#include "lockstep/model/forward.h"

#include <cmath>
#include <cstring>
#include <string>

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

int32_t RaggedBatch::add_sequence(const int32_t* new_tokens, int32_t n_new_tokens, int32_t n_ctx_tokens,
                                  const int32_t* blocks, int32_t n_blocks) {
  LS_CHECK(n_new_tokens >= 0 && n_ctx_tokens >= 0) << "add_sequence: n_new " << n_new_tokens << ", n_ctx "
                                                   << n_ctx_tokens << " (must be >= 0)";
  LS_CHECK(n_blocks >= 0 && n_blocks <= max_blocks)
      << "add_sequence: " << n_blocks << " blocks, the table rows hold " << max_blocks << " (set max_blocks first)";
  const int32_t row0 = static_cast<int32_t>(tokens.size());
  tokens.insert(tokens.end(), new_tokens, new_tokens + n_new_tokens);
  n_ctx.push_back(n_ctx_tokens);
  n_new.push_back(n_new_tokens);
  block_table.insert(block_table.end(), blocks, blocks + n_blocks);
  block_table.insert(block_table.end(), size_t(max_blocks - n_blocks), 0);
  return row0;
}

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

// The capture hook of one forward call (ForwardOptions::capture). Without a
// hook it holds nothing and each capture point is one pointer test.
class CapturePoints {
 public:
  CapturePoints(const ForwardOptions& o, const RaggedBatch& b, const std::vector<int32_t>& positions)
      : fn_(o.capture), ids_(o.capture_ids) {
    if (fn_ == nullptr) return;
    LS_CHECK(ids_ == nullptr || static_cast<int64_t>(ids_->size()) == b.num_seqs())
        << "capture_ids has " << ids_->size() << " entries, the batch " << b.num_seqs() << " sequences";
    seq_.reserve(positions.size());
    for (int64_t i = 0; i < b.num_seqs(); ++i) seq_.insert(seq_.end(), size_t(b.n_new[size_t(i)]), int32_t(i));
    pos_ = positions;
    for (int32_t r : b.logit_rows) {
      logit_seq_.push_back(seq_[size_t(r)]);
      logit_pos_.push_back(pos_[size_t(r)]);
    }
  }
  // Hands t (rows first, the other dims flattened) to the hook; `logit_rows`:
  // t's rows are the batch's logit rows, else all T tokens.
  void operator()(const char* name, int64_t layer, const Tensor& t, bool logit_rows = false) const {
    if (fn_ != nullptr) emit(name, layer, t, logit_rows);
  }

 private:
  void emit(const char* name, int64_t layer, const Tensor& t, bool logit_rows) const {
    int64_t cols = 1;
    for (int i = 1; i < t.ndim; ++i) cols *= t.shape[i];
    Captured c;
    c.name = name;
    c.layer = layer;
    c.data = Tensor(t.data, t.dtype, {t.dim(0), cols});
    c.seq = logit_rows ? logit_seq_.data() : seq_.data();
    c.pos = logit_rows ? logit_pos_.data() : pos_.data();
    c.seq_ids = ids_ ? ids_->data() : nullptr;
    (*fn_)(c);
  }

  const CaptureFn* fn_;
  const std::vector<uint64_t>* ids_;
  std::vector<int32_t> seq_, pos_;              // (T)
  std::vector<int32_t> logit_seq_, logit_pos_;  // (R)
};

// One transformer layer on x (the layer's input, T x D): attention block into
// h (returned), FFN block into env.ffn; what backward needs goes into *a
// (scratch when a is null). write_kv: store the layer's new keys/values (a
// recompute for backward finds them already cached). moe_index: the layer's
// index among MoE layers (routing replay and recording).
struct LayerEnv {
  const Context& ctx;
  const ModelConfig& c;
  const ModelWeights& weights;
  KvCache& kv;
  const BatchTensors& bt;
  const k::AttentionBatch& ab;
  const CapturePoints& capture;
  Scratch& ws;
  const ForwardOptions& opt;
  ForwardResult* result;
  Tensor qkv, kn, vn, ffn;
};

Tensor run_layer(const LayerEnv& env, int64_t l, Tensor x, LayerActivations* a, int64_t moe_index, bool write_kv) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const ModelWeights& weights = env.weights;
  KvCache& kv = env.kv;
  const BatchTensors& bt = env.bt;
  const k::AttentionBatch& ab = env.ab;
  const CapturePoints& capture = env.capture;
  Scratch& ws = env.ws;
  const ForwardOptions& opt = env.opt;
  ForwardResult* result = env.result;
  Tensor qkv = env.qkv, kn = env.kn, vn = env.vn, ffn = env.ffn;
  const int64_t T = bt.positions_t.view().dim(0), D = c.hidden_size, H = c.num_heads, Hkv = c.num_kv_heads,
                Dh = c.head_dim, K = c.num_experts_per_tok, n_moe = count_moe_layers(c);
  const float scale = attention_scale(c);
  const float eps = float(c.rms_norm_eps);
  const DType f32 = DType::F32;
  auto buf = [&](OwnedTensor* f, size_t slot, DType dt, std::initializer_list<int64_t> shape) {
    return f != nullptr ? reuse(*f, dt, shape) : ws.get(slot, dt, shape);
  };
  auto field = [&](LayerActivations* la, OwnedTensor LayerActivations::*m) { return la ? &(la->*m) : nullptr; };
  const LayerParams& p = weights.params().layers[static_cast<size_t>(l)];
  const PackedLayer& w = weights.layer(l);
  using LA = LayerActivations;

  // Attention block.
  Tensor rstd1 = buf(field(a, &LA::rstd1), kSlotRstd, f32, {T});
  Tensor normed1 = buf(field(a, &LA::normed1), kSlotNormed, f32, {T, D});
  k::rmsnorm_forward(ctx, normed1, rstd1, x, p.attn_norm, eps);
  capture("attn_norm", l, normed1);
  k::gemm_xwt(ctx, qkv, normed1, w.wqkv);
  if (c.qkv_bias) add_row_bias(ctx, qkv, p.bqkv);
  Tensor q = buf(field(a, &LA::q), kSlotQ, f32, {T, H, Dh});
  if (c.qk_norm) {
    // Per-head RMSNorm over Dh on the (T*H, Dh) and (T*Hkv, Dh) views.
    Tensor q_pre = buf(field(a, &LA::q_pre), kSlotQPre, f32, {T, H, Dh});
    Tensor k_pre = buf(field(a, &LA::k_pre), kSlotKPre, f32, {T, Hkv, Dh});
    Tensor rstd_q = buf(field(a, &LA::rstd_q), kSlotRstdQ, f32, {T * H});
    Tensor rstd_k = buf(field(a, &LA::rstd_k), kSlotRstdK, f32, {T * Hkv});
    split_qkv(ctx, q_pre, k_pre, vn, qkv);
    k::rmsnorm_forward(ctx, q.reshape({T * H, Dh}), rstd_q, q_pre.reshape({T * H, Dh}), p.q_norm, eps);
    k::rmsnorm_forward(ctx, kn.reshape({T * Hkv, Dh}), rstd_k, k_pre.reshape({T * Hkv, Dh}), p.k_norm, eps);
  } else if (a) {
    for (OwnedTensor* f : {&a->q_pre, &a->k_pre, &a->rstd_q, &a->rstd_k}) drop(*f);
    split_qkv(ctx, q, kn, vn, qkv);
  } else {
    split_qkv(ctx, q, kn, vn, qkv);
  }
  k::rope_forward(ctx, q, bt.positions_t.view(), weights.rope());
  k::rope_forward(ctx, kn, bt.positions_t.view(), weights.rope());
  capture("q", l, q);
  capture("k", l, kn);
  capture("v", l, vn);
  if (write_kv) k::kv_cache_write(ctx, kv.k(l), kv.v(l), kn, vn, ab);
  Tensor attn = buf(field(a, &LA::attn), kSlotAttn, f32, {T, H * Dh});
  Tensor lse = a ? reuse(a->lse, f32, {T, H}) : Tensor();
  k::attention_forward(ctx, attn.reshape({T, H, Dh}), lse, q, kv.k(l), kv.v(l), ab, scale);
  capture("attn", l, attn);
  // h = x + attn·Woᵀ, then normed2 = rmsnorm(h).
  k::gemm_xwt(ctx, ffn, attn, w.wo);
  capture("attn_out", l, ffn);
  Tensor h = buf(field(a, &LA::h), kSlotH, f32, {T, D});
  Tensor rstd2 = buf(field(a, &LA::rstd2), kSlotRstd, f32, {T});
  Tensor normed2 = buf(field(a, &LA::normed2), kSlotNormed, f32, {T, D});
  k::add_rmsnorm_forward(ctx, normed2, h, rstd2, x, ffn, p.mlp_norm, eps);
  capture("attn_residual", l, h);
  capture("ffn_norm", l, normed2);

  // FFN block: ffn = FFN(normed2).
  if (!p.is_moe) {
    const int64_t F = c.intermediate_size;
    if (a) {
      for (OwnedTensor* f : {&a->scores, &a->topk_idx, &a->topk_w, &a->xe, &a->gu_e, &a->act_e, &a->ye, &a->gu_s,
                             &a->act_s, &a->ys, &a->sgate})
        drop(*f);
      a->plan = {};
      a->route = {};
    }
    mlp_forward(ctx, ffn, buf(field(a, &LA::gu), kSlotGu, f32, {T, 2 * F}),
                buf(field(a, &LA::act), kSlotAct, f32, {T, F}), normed2, w.mlp, false);
  } else {
    const int64_t E = c.num_experts, Fe = c.moe_intermediate_size;
    if (a) {
      drop(a->gu);
      drop(a->act);
    }
    Tensor logits = ws.get(kSlotRouter, f32, {T, E});
    Tensor scores = buf(field(a, &LA::scores), kSlotScores, f32, {T, E});
    Tensor topk_idx = buf(field(a, &LA::topk_idx), kSlotTopkIdx, DType::I32, {T, K});
    Tensor topk_w = buf(field(a, &LA::topk_w), kSlotTopkW, f32, {T, K});
    k::gemm_xwt(ctx, logits, normed2, w.router);
    capture("router_logits", l, logits);
    Tensor replay;
    if (opt.replay_experts != nullptr) {
      replay = ws.get(kSlotReplay, DType::I32, {T, K});
      gather_layer_experts(replay, *opt.replay_experts, moe_index, n_moe, K);
    }
    k::moe_route(ctx, topk_idx, topk_w, scores, logits, p.router_bias, replay, router_config(c));
    capture("experts", l, topk_idx);
    capture("expert_weights", l, topk_w);
    if (opt.record_experts) scatter_layer_experts(result->routed_experts, topk_idx, moe_index, n_moe, K);
    k::MoeDispatch local_plan;
    k::MoeDispatch& plan = a ? a->plan : local_plan;
    plan = k::moe_plan(topk_idx, static_cast<int>(E));
    Tensor ye = buf(field(a, &LA::ye), kSlotYe, f32, {T * K, D});
    if (opt.experts == nullptr) {
      Tensor xe = buf(field(a, &LA::xe), kSlotXe, f32, {T * K, D});
      Tensor gu_e = buf(field(a, &LA::gu_e), kSlotGu, f32, {T * K, 2 * Fe});
      Tensor act_e = buf(field(a, &LA::act_e), kSlotAct, f32, {T * K, Fe});
      k::moe_gather(ctx, xe, normed2, plan);
      for_each_expert(ctx, plan, [&](int64_t e, const Context& ectx) {
        const int64_t r0 = plan.offsets[size_t(e)], r1 = plan.offsets[size_t(e) + 1];
        mlp_forward(ectx, ye.slice_rows(r0, r1), gu_e.slice_rows(r0, r1), act_e.slice_rows(r0, r1),
                    xe.slice_rows(r0, r1), w.experts[size_t(e)], false);
      });
    } else {
      // Expert parallelism: this rank's rows travel to their experts' owners,
      // the rows of this rank's experts arrive from the whole group.
      ExpertRoute local_route;
      ExpertRoute& route = a ? a->route : local_route;
      route = expert_route(*opt.experts, plan, weights.experts());
      const int64_t N = route.num_in();
      Tensor xs = ws.get(kSlotXe, f32, {T * K, D});
      k::moe_gather(ctx, xs, normed2, plan);
      Tensor xr = buf(field(a, &LA::xe), kSlotXr, f32, {N, D});
      Tensor stage = ws.get(kSlotEpStage, f32, {N, D});
      expert_dispatch(ctx, *opt.experts, route, xs, xr, stage);
      Tensor gu_e = buf(field(a, &LA::gu_e), kSlotGu, f32, {N, 2 * Fe});
      Tensor act_e = buf(field(a, &LA::act_e), kSlotAct, f32, {N, Fe});
      Tensor yr = ws.get(kSlotYr, f32, {N, D});
      for_each_expert(ctx, route.local, [&](int64_t e, const Context& ectx) {
        const int64_t r0 = route.local.offsets[size_t(e)], r1 = route.local.offsets[size_t(e) + 1];
        mlp_forward(ectx, yr.slice_rows(r0, r1), gu_e.slice_rows(r0, r1), act_e.slice_rows(r0, r1),
                    xr.slice_rows(r0, r1), w.experts[size_t(e)], false);
      });
      expert_return(ctx, *opt.experts, route, yr, ye, stage);
    }
    k::moe_combine(ctx, ffn, ye, topk_w, plan);
    capture("moe_out", l, ffn);
    if (c.has_shared_expert()) {
      const int64_t Fs = c.shared_expert_intermediate_size;
      Tensor gu_s = buf(field(a, &LA::gu_s), kSlotGuS, f32, {T, 2 * Fs});
      Tensor act_s = buf(field(a, &LA::act_s), kSlotActS, f32, {T, Fs});
      Tensor ys = buf(field(a, &LA::ys), kSlotYs, f32, {T, D});
      mlp_forward(ctx, ys, gu_s, act_s, normed2, w.shared, false);
      capture("shared_out", l, ys);
      Tensor sgate;
      if (c.shared_expert_gate) {
        sgate = buf(field(a, &LA::sgate), kSlotSgate, f32, {T});
        shared_gate_forward(ctx, sgate, normed2, w.shared_gate);
      } else if (a) {
        drop(a->sgate);
      }
      add_shared_expert(ctx, ffn, ys, sgate);
    } else if (a) {
      for (OwnedTensor* f : {&a->gu_s, &a->act_s, &a->ys, &a->sgate}) drop(*f);
    }
  }
  return h;
}

}  // namespace

namespace {
// Every saved field of a layer but its input x_in.
std::vector<OwnedTensor*> recomputed_fields(LayerActivations& a) {
  return {&a.rstd1, &a.normed1, &a.q_pre, &a.k_pre, &a.rstd_q, &a.rstd_k, &a.q, &a.attn, &a.lse,
          &a.h, &a.rstd2, &a.normed2, &a.gu, &a.act, &a.scores, &a.topk_idx, &a.topk_w, &a.xe,
          &a.gu_e, &a.act_e, &a.ye, &a.gu_s, &a.act_s, &a.ys, &a.sgate};
}
}  // namespace

void drop_layer(LayerActivations& a) {
  for (OwnedTensor* f : recomputed_fields(a)) drop(*f);
  a.plan = {};
  a.route = {};
}

void pass_layer_buffers(LayerActivations& from, LayerActivations& to) {
  const auto src = recomputed_fields(from), dst = recomputed_fields(to);
  for (size_t i = 0; i < src.size(); ++i) {
    drop(*dst[i]);
    std::swap(*src[i], *dst[i]);
  }
  from.plan = {};
  from.route = {};
}

void recompute_layer(const Context& ctx, const ModelWeights& weights, KvCache& kv, const RaggedBatch& batch,
                     const BatchTensors& bt, const ForwardOptions& opt, ForwardResult* result, int64_t l,
                     int64_t moe_index, Activations& saved) {
  const ModelConfig& c = weights.config();
  const int64_t T = batch.num_tokens(), D = c.hidden_size, Hkv = c.num_kv_heads, Dh = c.head_dim;
  const int64_t QKV = (c.num_heads + 2 * Hkv) * Dh;
  const CapturePoints capture(opt, batch, bt.positions);
  Scratch& ws = kv.scratch();
  const k::AttentionBatch ab = bt.attention_batch();
  const DType f32 = DType::F32;
  const LayerEnv env{ctx, c, weights, kv, bt, ab, capture, ws, opt, result,
                     ws.get(kSlotQkv, f32, {T, QKV}), ws.get(kSlotK, f32, {T, Hkv, Dh}),
                     ws.get(kSlotV, f32, {T, Hkv, Dh}), ws.get(kSlotFfn, f32, {T, D})};
  LayerActivations& a = saved.layers[static_cast<size_t>(l)];
  run_layer(env, l, a.x_in.view(), &a, moe_index, false);
}

namespace {

}  // namespace

// Buffers: what backward needs is computed straight into the saved
// Activations (reused from the previous call when the shapes match), the rest
// into the cache's scratch slots, so a warm call allocates nothing and no
// activation is copied.
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
  if (n_moe > 0) {
    const ExpertShard want = opt.experts ? ExpertShard::of_rank(c.num_experts, opt.experts->size(),
                                                                opt.experts->rank())
                                         : ExpertShard{};
    LS_CHECK(weights.experts() == want)
        << "forward: the weights hold experts [" << weights.experts().first << ", "
        << weights.experts().first + weights.experts().count << ") (count -1: all), "
        << (opt.experts ? "this rank's expert-parallel shard is [" : "a forward without expert parallelism needs all")
        << (opt.experts ? std::to_string(want.first) + ", " + std::to_string(want.first + want.count) + ")" : "");
  }

  BatchTensors bt(batch, kv.block_size());
  const CapturePoints capture(opt, batch, bt.positions);
  if (save) {
    saved->layers.resize(static_cast<size_t>(c.num_layers));
    saved->positions = bt.positions;
    saved->recompute = opt.recompute;
    saved->experts = opt.experts;
    if (opt.recompute && opt.replay_experts != nullptr)
      saved->replay = *opt.replay_experts;
    else
      saved->replay.clear();
  }
  Scratch& ws = kv.scratch();
  // A buffer that backward needs (saved field f of layer activations a) or
  // scratch slot `slot` when nothing is saved.
  auto buf = [&](OwnedTensor* f, size_t slot, DType dt, std::initializer_list<int64_t> shape) {
    return f != nullptr ? reuse(*f, dt, shape) : ws.get(slot, dt, shape);
  };
  auto field = [&](LayerActivations* a, OwnedTensor LayerActivations::*m) { return a ? &(a->*m) : nullptr; };
  const DType f32 = DType::F32;

  // Residual stream entering layer 0: saved as its x_in.
  LayerActivations* a0 = save && c.num_layers > 0 ? &saved->layers[0] : nullptr;
  Tensor x = buf(field(a0, &LayerActivations::x_in), kSlotX, f32, {T, D});
  k::embedding_forward(ctx, x, weights.params().embed, bt.tokens.view());
  capture("embed", -1, x);

  const float eps = float(c.rms_norm_eps);
  const k::AttentionBatch ab = bt.attention_batch();
  Tensor qkv = ws.get(kSlotQkv, f32, {T, QKV});
  Tensor kn = ws.get(kSlotK, f32, {T, Hkv, Dh}), vn = ws.get(kSlotV, f32, {T, Hkv, Dh});
  Tensor ffn = ws.get(kSlotFfn, f32, {T, D});

  const LayerEnv env{ctx, c, weights, kv, bt, ab, capture, ws, opt, result, qkv, kn, vn, ffn};
  int64_t moe_index = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerActivations* a = save ? &saved->layers[static_cast<size_t>(l)] : nullptr;
    const Tensor h = run_layer(env, l, x, a, moe_index, true);
    if (weights.params().layers[static_cast<size_t>(l)].is_moe) ++moe_index;
    capture("ffn_out", l, ffn);
    // x = h + ffn (one f32 add per element), into the next layer's saved
    // x_in when saving (the last layer's output goes to scratch: only its
    // logit rows are kept).
    LayerActivations* next = a && l + 1 < c.num_layers ? &saved->layers[static_cast<size_t>(l) + 1] : nullptr;
    x = next ? reuse(next->x_in, f32, {T, D}) : ws.get(kSlotX, f32, {T, D});
    add_into(ctx, x, h, ffn);
    capture("residual", l, x);
    // Recompute mode: only x_in is kept; the buffers go on to the next layer
    // (same shapes, no new allocation), and the last layer keeps them for
    // backward, which starts there.
    if (a && opt.recompute && next) pass_layer_buffers(*a, *next);
  }

  // Final norm on the wanted rows only, then the vocabulary projection.
  Tensor rows = save ? reuse(saved->x_final, f32, {R, D}) : ws.get(kSlotRows, f32, {R, D});
  gather_rows(ctx, rows, x, batch.logit_rows);
  Tensor rows_normed = save ? reuse(saved->normed_rows, f32, {R, D}) : ws.get(kSlotRowsNormed, f32, {R, D});
  Tensor rstd_f = save ? reuse(saved->rstd_f, f32, {R}) : ws.get(kSlotRstdF, f32, {R});
  k::rmsnorm_forward(ctx, rows_normed, rstd_f, rows, weights.params().final_norm, eps);
  capture("final_norm", c.num_layers, rows_normed, true);
  Tensor logits = reuse(result->logits, f32, {R, c.vocab_size});
  if (R > 0) k::gemm_xwt(ctx, logits, rows_normed, weights.lm_head());
  capture("logits", c.num_layers, logits, true);
}

}  // namespace lockstep::model
