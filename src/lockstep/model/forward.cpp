// Transformer forward over a ragged batch with a paged KV cache. One code path
// for prefill, decode and the trainer: only the batch differs.
#include "lockstep/model/forward.h"

#include <cmath>
#include <cstring>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/embedding.h"
#include "lockstep/kernels/cpu/fp8_quant.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/rmsnorm.h"
#include "lockstep/kernels/cpu/rope.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/forward_util.h"
#include "lockstep/model/v4_forward.h"

namespace lockstep::model {

namespace k = lockstep::kernels;

float attention_scale(const ModelConfig& c) {
  return static_cast<float>(1.0 / std::sqrt(double(c.head_dim)));
}

int32_t RaggedBatch::add_sequence(const int32_t* new_tokens, int32_t n_new_tokens, int32_t n_ctx_tokens,
                                  const int32_t* blocks, int32_t n_blocks) {
  LS_CHECK(n_new_tokens >= 0 && n_ctx_tokens >= 0)
      << "add_sequence: n_new " << n_new_tokens << ", n_ctx " << n_ctx_tokens << " (must be >= 0)";
  LS_CHECK(n_blocks >= 0 && n_blocks <= max_blocks)
      << "add_sequence: " << n_blocks << " blocks, the table rows hold " << max_blocks
      << " (set max_blocks first)";
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
      LS_THROW << "batch: sequence " << i << " needs " << n_ctx[i] + n_new[i]
               << " positions, its block table holds " << int64_t(max_blocks) * kv.block_size();
    if (int64_t(n_ctx[i]) + n_new[i] > c.max_position_embeddings)
      LS_THROW << "batch: sequence " << i << " reaches position " << n_ctx[i] + n_new[i]
               << ", beyond max_position_embeddings " << c.max_position_embeddings;
  }
  if (t != num_tokens())
    LS_THROW << "batch: sum(n_new) = " << t << " but " << num_tokens() << " tokens given";
  for (int32_t tok : tokens)
    if (tok < 0 || tok >= c.vocab_size)
      LS_THROW << "batch: token id " << tok << " outside [0, " << c.vocab_size << ")";
  for (size_t r = 0; r < logit_rows.size(); ++r) {
    if (logit_rows[r] < 0 || logit_rows[r] >= t || (r > 0 && logit_rows[r] <= logit_rows[r - 1]))
      LS_THROW << "batch: logit_rows must be ascending rows of [0, " << t << "), got " << logit_rows[r]
               << " at " << r;
  }
}

namespace {

// The LoRA adapters of layer l, or null (no adapters on these weights).
const LoraLayer* lora_of(const ModelWeights& weights, int64_t l) {
  return weights.lora() ? &weights.lora()->params.layers[static_cast<size_t>(l)] : nullptr;
}
float lora_scale(const ModelWeights& weights) {
  return weights.lora() ? weights.lora()->scale() : 0.0f;
}

// Runs one SwiGLU FFN on rows x (N, D): gu (N, 2F) = x·[Wg;Wu]ᵀ, act = silu(g)*u, y = act·Wdᵀ.
// lora (may be null): each adapter adds to its projection's output before
// the next step reads it (gate and up on their halves of gu).
void mlp_forward(const Context& ctx, Tensor y, Tensor gu, Tensor act, const Tensor& x, const PackedMlp& w,
                 bool accumulate, const LoraMlp* lora = nullptr, float lora_s = 0.0f) {
  const int64_t F = act.dim(1);
  project(ctx, gu, x, w.gate_up);
  if (lora) {
    lora_forward(ctx, gu.slice_cols(0, F), x, lora->gate, lora_s);
    lora_forward(ctx, gu.slice_cols(F, 2 * F), x, lora->up, lora_s);
  }
  k::swiglu_forward(ctx, act, gu.slice_cols(0, F), gu.slice_cols(F, 2 * F));
  project(ctx, y, act, w.down, accumulate);
  if (lora) lora_forward(ctx, y, act, lora->down, lora_s);
}

// The one place an activation's buffer is chosen: the saved tensor backward
// reads (`saved`, reused from the previous call when the shape matches), or
// workspace slot `slot` when nothing is saved. Computing straight into the
// saved tensor means no activation is ever copied.
Tensor activation_buffer(OwnedTensor* saved, Workspace& ws, size_t slot, DType dt,
                         std::initializer_list<int64_t> shape) {
  return saved != nullptr ? reuse(ws.memory(), *saved, dt, shape) : ws.get(slot, dt, shape);
}

// One layer's activations: fields of its LayerActivations when saving for
// backward, workspace slots otherwise.
class LayerBuffers {
 public:
  using Field = OwnedTensor LayerActivations::*;
  LayerBuffers(LayerActivations* saved, Workspace& ws) : saved_(saved), ws_(ws) {}

  Tensor get(Field f, size_t slot, DType dt, std::initializer_list<int64_t> shape) const {
    return activation_buffer(saved_ ? &(saved_->*f) : nullptr, ws_, slot, dt, shape);
  }
  // An output only backward reads (the kernel skips it when empty).
  Tensor saved_only(Field f, DType dt, std::initializer_list<int64_t> shape) const {
    return saved_ ? reuse(ws_.memory(), saved_->*f, dt, shape) : Tensor();
  }
  // Frees saved fields this layer does not fill (left by an earlier call).
  void drop(std::initializer_list<Field> fields) const {
    if (saved_)
      for (Field f : fields) model::drop(saved_->*f);
  }
  void drop_routing() const {
    if (saved_) {
      saved_->plan = {};
      saved_->route = {};
    }
  }
  // The MoE dispatch plan and expert-parallel route: saved, or the caller's.
  kernels::MoeDispatch& plan(kernels::MoeDispatch& local) const { return saved_ ? saved_->plan : local; }
  ExpertRoute& route(ExpertRoute& local) const { return saved_ ? saved_->route : local; }

 private:
  LayerActivations* saved_;
  Workspace& ws_;
};

using LA = LayerActivations;

// What every layer of one forward call shares. qkv, kn, vn and ffn are
// workspace buffers no layer's backward reads.
struct LayerEnv {
  LayerEnv(const Context& ctx, const ModelWeights& weights, const KvCache& kv, Workspace& ws,
           const BatchTensors& bt, const k::AttentionBatch& ab, const CapturePoints& capture,
           const ForwardOptions& opt, ForwardResult* result)
      : ctx(ctx),
        c(weights.config()),
        weights(weights),
        kv(kv),
        ws(ws),
        bt(bt),
        ab(ab),
        capture(capture),
        opt(opt),
        result(result),
        T(bt.positions_t.view().dim(0)) {
    const int64_t Hkv = c.num_kv_heads, Dh = c.head_dim;
    qkv = ws.get(kSlotQkv, DType::F32, {T, (c.num_heads + 2 * Hkv) * Dh});
    kn = ws.get(kSlotK, DType::F32, {T, Hkv, Dh});
    vn = ws.get(kSlotV, DType::F32, {T, Hkv, Dh});
    ffn = ws.get(kSlotFfn, DType::F32, {T, c.hidden_size});
  }

  const Context& ctx;
  const ModelConfig& c;
  const ModelWeights& weights;
  const KvCache& kv;
  Workspace& ws;
  const BatchTensors& bt;
  const k::AttentionBatch& ab;
  const CapturePoints& capture;
  const ForwardOptions& opt;
  ForwardResult* result;
  int64_t T;
  Tensor qkv;  // (T, (H+2Hkv)*Dh)
  Tensor kn;   // (T, Hkv, Dh) keys as written to the cache
  Tensor vn;   // (T, Hkv, Dh) values
  Tensor ffn;  // (T, D) o_proj output, then the FFN's output
};

// q (T, H, Dh), env.kn and env.vn from env.qkv; qk_norm models normalise
// q and k per head over Dh (on (T*H, Dh) and (T*Hkv, Dh) views).
void split_heads(const LayerEnv& env, const LayerParams& p, const LayerBuffers& out, Tensor q) {
  const ModelConfig& c = env.c;
  if (!c.qk_norm) {
    out.drop({&LA::q_pre, &LA::k_pre, &LA::rstd_q, &LA::rstd_k});
    split_qkv(env.ctx, q, env.kn, env.vn, env.qkv);
    return;
  }
  const int64_t T = env.T, H = c.num_heads, Hkv = c.num_kv_heads, Dh = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  const DType f32 = DType::F32;
  Tensor q_pre = out.get(&LA::q_pre, kSlotQPre, f32, {T, H, Dh});
  Tensor k_pre = out.get(&LA::k_pre, kSlotKPre, f32, {T, Hkv, Dh});
  Tensor rstd_q = out.get(&LA::rstd_q, kSlotRstdQ, f32, {T * H});
  Tensor rstd_k = out.get(&LA::rstd_k, kSlotRstdK, f32, {T * Hkv});
  split_qkv(env.ctx, q_pre, k_pre, env.vn, env.qkv);
  k::rmsnorm_forward(env.ctx, q.reshape({T * H, Dh}), rstd_q, q_pre.reshape({T * H, Dh}), p.q_norm, eps);
  k::rmsnorm_forward(env.ctx, env.kn.reshape({T * Hkv, Dh}), rstd_k, k_pre.reshape({T * Hkv, Dh}), p.k_norm,
                     eps);
}

struct AttentionOut {
  Tensor h;        // (T, D) x + attention projection
  Tensor normed2;  // (T, D) rmsnorm(h), the FFN's input
};

// Attention block of layer l on x (T, D). write_kv: store the new keys and
// values (a recompute for backward finds them already cached).
AttentionOut attention_block(const LayerEnv& env, int64_t l, const Tensor& x, const LayerBuffers& out,
                             bool write_kv) {
  const Context& ctx = env.ctx;
  const ModelConfig& c = env.c;
  const int64_t T = env.T, D = c.hidden_size, H = c.num_heads, Dh = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  const DType f32 = DType::F32;
  const LayerParams& p = env.weights.params().layers[static_cast<size_t>(l)];
  const PackedLayer& w = env.weights.layer(l);
  const Tensor positions = env.bt.positions_t.view();

  Tensor rstd1 = out.get(&LA::rstd1, kSlotRstd, f32, {T});
  Tensor normed1 = out.get(&LA::normed1, kSlotNormed, f32, {T, D});
  k::rmsnorm_forward(ctx, normed1, rstd1, x, p.attn_norm, eps);
  env.capture("attn_norm", l, normed1);
  project(ctx, env.qkv, normed1, w.wqkv);
  if (c.qkv_bias) add_row_bias(ctx, env.qkv, p.bqkv);
  const LoraLayer* lora = lora_of(env.weights, l);
  const float lora_s = lora_scale(env.weights);
  if (lora) {  // q, k, v adapters on their column blocks of the fused output
    const int64_t nq = H * Dh, nk = c.num_kv_heads * Dh;
    lora_forward(ctx, env.qkv.slice_cols(0, nq), normed1, lora->q, lora_s);
    lora_forward(ctx, env.qkv.slice_cols(nq, nq + nk), normed1, lora->k, lora_s);
    lora_forward(ctx, env.qkv.slice_cols(nq + nk, nq + 2 * nk), normed1, lora->v, lora_s);
  }
  Tensor q = out.get(&LA::q, kSlotQ, f32, {T, H, Dh});
  split_heads(env, p, out, q);
  k::rope_forward(ctx, q, positions, env.weights.rope());
  k::rope_forward(ctx, env.kn, positions, env.weights.rope());
  env.capture("q", l, q);
  env.capture("k", l, env.kn);
  env.capture("v", l, env.vn);
  if (write_kv) k::kv_cache_write(ctx, env.kv.k(l), env.kv.v(l), env.kn, env.vn, env.ab);
  Tensor attn = out.get(&LA::attn, kSlotAttn, f32, {T, H * Dh});
  Tensor lse = out.saved_only(&LA::lse, f32, {T, H});
  k::attention_forward(ctx, attn.reshape({T, H, Dh}), lse, q, env.kv.k(l), env.kv.v(l), env.ab,
                       attention_scale(c));
  env.capture("attn", l, attn);
  // h = x + attn·Woᵀ, then normed2 = rmsnorm(h).
  project(ctx, env.ffn, attn, w.wo);
  if (lora) lora_forward(ctx, env.ffn, attn, lora->o, lora_s);
  env.capture("attn_out", l, env.ffn);
  Tensor h = out.get(&LA::h, kSlotH, f32, {T, D});
  Tensor rstd2 = out.get(&LA::rstd2, kSlotRstd, f32, {T});
  Tensor normed2 = out.get(&LA::normed2, kSlotNormed, f32, {T, D});
  k::add_rmsnorm_forward(ctx, normed2, h, rstd2, x, env.ffn, p.mlp_norm, eps);
  env.capture("attn_residual", l, h);
  env.capture("ffn_norm", l, normed2);
  return {h, normed2};
}

// env.ffn = SwiGLU(normed2) of a dense layer.
void dense_ffn(const LayerEnv& env, int64_t l, const Tensor& normed2, const LayerBuffers& out) {
  const int64_t T = env.T, F = env.c.intermediate_size;
  out.drop({&LA::scores, &LA::topk_idx, &LA::topk_w, &LA::xe, &LA::gu_e, &LA::act_e, &LA::ye, &LA::gu_s,
            &LA::act_s, &LA::ys, &LA::sgate});
  out.drop_routing();
  mlp_forward(env.ctx, env.ffn, out.get(&LA::gu, kSlotGu, DType::F32, {T, 2 * F}),
              out.get(&LA::act, kSlotAct, DType::F32, {T, F}), normed2, env.weights.layer(l).mlp, false,
              lora_of(env.weights, l) ? &lora_of(env.weights, l)->mlp : nullptr, lora_scale(env.weights));
}

struct Routing {
  Tensor experts;  // (T, K) i32
  Tensor weights;  // (T, K)
};

// The router of MoE layer l (moe_index-th among MoE layers): each row's K
// experts (this router's top-k, or opt.replay_experts) and gate weights.
Routing route_rows(const LayerEnv& env, int64_t l, int64_t moe_index, const Tensor& normed2,
                   const LayerBuffers& out) {
  const ModelConfig& c = env.c;
  const ForwardOptions& opt = env.opt;
  const int64_t T = env.T, E = c.num_experts, K = c.num_experts_per_tok, n_moe = c.num_moe_layers();
  const DType f32 = DType::F32;
  Tensor logits = env.ws.get(kSlotRouter, f32, {T, E});
  Tensor scores = out.get(&LA::scores, kSlotScores, f32, {T, E});
  Tensor topk_idx = out.get(&LA::topk_idx, kSlotTopkIdx, DType::I32, {T, K});
  Tensor topk_w = out.get(&LA::topk_w, kSlotTopkW, f32, {T, K});
  k::gemm_xwt(env.ctx, logits, normed2, env.weights.layer(l).router);
  env.capture("router_logits", l, logits);
  Tensor replay;
  if (opt.replay_experts != nullptr) {
    replay = env.ws.get(kSlotReplay, DType::I32, {T, K});
    gather_layer_experts(env.ctx, replay, *opt.replay_experts, moe_index, n_moe, K);
  }
  const LayerParams& p = env.weights.params().layers[static_cast<size_t>(l)];
  k::moe_route(env.ctx, topk_idx, topk_w, scores, logits, p.router_bias, replay, router_config(c));
  env.capture("experts", l, topk_idx);
  env.capture("expert_weights", l, topk_w);
  if (opt.record_experts) scatter_layer_experts(env.result->routed_experts, topk_idx, moe_index, n_moe, K);
  return {topk_idx, topk_w};
}

// ye (T*K, D) = each routed row through its expert, all experts on this rank.
void local_experts(const LayerEnv& env, int64_t l, const Tensor& normed2, const LayerBuffers& out,
                   const k::MoeDispatch& plan, Tensor ye) {
  const int64_t T = env.T, D = env.c.hidden_size, K = env.c.num_experts_per_tok,
                Fe = env.c.moe_intermediate_size;
  const DType f32 = DType::F32;
  const PackedLayer& w = env.weights.layer(l);
  Tensor xe = out.get(&LA::xe, kSlotXe, f32, {T * K, D});
  Tensor gu_e = out.get(&LA::gu_e, kSlotGu, f32, {T * K, 2 * Fe});
  Tensor act_e = out.get(&LA::act_e, kSlotAct, f32, {T * K, Fe});
  k::moe_gather(env.ctx, xe, normed2, plan);
  const LoraLayer* lora = lora_of(env.weights, l);
  for_each_expert(env.ctx, plan, [&](int64_t e, const Context& ectx) {
    const int64_t r0 = plan.offsets[size_t(e)], r1 = plan.offsets[size_t(e) + 1];
    mlp_forward(ectx, ye.slice_rows(r0, r1), gu_e.slice_rows(r0, r1), act_e.slice_rows(r0, r1),
                xe.slice_rows(r0, r1), w.experts[size_t(e)], false, lora_expert(lora, e),
                lora_scale(env.weights));
  });
}

// As local_experts with expert parallelism: this rank's rows travel to their
// experts' owners, the rows of this rank's experts arrive from the whole
// group, and their outputs travel back.
void parallel_experts(const LayerEnv& env, int64_t l, const Tensor& normed2, const LayerBuffers& out,
                      const k::MoeDispatch& plan, Tensor ye) {
  const Context& ctx = env.ctx;
  ExpertComm& comm = *env.opt.experts;
  const int64_t T = env.T, D = env.c.hidden_size, K = env.c.num_experts_per_tok,
                Fe = env.c.moe_intermediate_size;
  const DType f32 = DType::F32;
  const PackedLayer& w = env.weights.layer(l);
  ExpertRoute local_route;
  ExpertRoute& route = out.route(local_route);
  route = expert_route(comm, plan, env.weights.experts());
  const int64_t N = route.num_in();
  Tensor xs = env.ws.get(kSlotXe, f32, {T * K, D});
  k::moe_gather(ctx, xs, normed2, plan);
  Tensor xr = out.get(&LA::xe, kSlotXr, f32, {N, D});
  Tensor stage = env.ws.get(kSlotEpStage, f32, {N, D});
  expert_dispatch(ctx, comm, route, xs, xr, stage);
  const LoraLayer* lora = lora_of(env.weights, l);
  Tensor gu_e = out.get(&LA::gu_e, kSlotGu, f32, {N, 2 * Fe});
  Tensor act_e = out.get(&LA::act_e, kSlotAct, f32, {N, Fe});
  Tensor yr = env.ws.get(kSlotYr, f32, {N, D});
  for_each_expert(ctx, route.local, [&](int64_t e, const Context& ectx) {
    const int64_t r0 = route.local.offsets[size_t(e)], r1 = route.local.offsets[size_t(e) + 1];
    mlp_forward(ectx, yr.slice_rows(r0, r1), gu_e.slice_rows(r0, r1), act_e.slice_rows(r0, r1),
                xr.slice_rows(r0, r1), w.experts[size_t(e)], false, lora_expert(lora, e),
                lora_scale(env.weights));
  });
  expert_return(ctx, comm, route, yr, ye, stage);
}

// env.ffn += the shared expert of normed2 (gated in Qwen2-MoE), if any.
void shared_expert(const LayerEnv& env, int64_t l, const Tensor& normed2, const LayerBuffers& out) {
  const ModelConfig& c = env.c;
  if (!c.has_shared_expert()) {
    out.drop({&LA::gu_s, &LA::act_s, &LA::ys, &LA::sgate});
    return;
  }
  const int64_t T = env.T, D = c.hidden_size, Fs = c.shared_expert_intermediate_size;
  const DType f32 = DType::F32;
  const PackedLayer& w = env.weights.layer(l);
  Tensor gu_s = out.get(&LA::gu_s, kSlotGuS, f32, {T, 2 * Fs});
  Tensor act_s = out.get(&LA::act_s, kSlotActS, f32, {T, Fs});
  Tensor ys = out.get(&LA::ys, kSlotYs, f32, {T, D});
  const LoraLayer* lora = lora_of(env.weights, l);
  mlp_forward(env.ctx, ys, gu_s, act_s, normed2, w.shared, false, lora ? &lora->shared : nullptr,
              lora_scale(env.weights));
  env.capture("shared_out", l, ys);
  Tensor sgate;
  if (c.shared_expert_gate) {
    sgate = out.get(&LA::sgate, kSlotSgate, f32, {T});
    shared_gate_forward(env.ctx, sgate, normed2, w.shared_gate);
  } else {
    out.drop({&LA::sgate});
  }
  add_shared_expert(env.ctx, env.ffn, ys, sgate);
}

// env.ffn = the MoE FFN of normed2: routed experts' weighted sum, plus the
// shared expert.
void moe_ffn(const LayerEnv& env, int64_t l, int64_t moe_index, const Tensor& normed2,
             const LayerBuffers& out) {
  const int64_t T = env.T, D = env.c.hidden_size, K = env.c.num_experts_per_tok;
  out.drop({&LA::gu, &LA::act});
  const Routing r = route_rows(env, l, moe_index, normed2, out);
  k::MoeDispatch local_plan;
  k::MoeDispatch& plan = out.plan(local_plan);
  plan = k::moe_plan(r.experts, static_cast<int>(env.c.num_experts));
  Tensor ye = out.get(&LA::ye, kSlotYe, DType::F32, {T * K, D});
  if (env.opt.experts == nullptr)
    local_experts(env, l, normed2, out, plan, ye);
  else
    parallel_experts(env, l, normed2, out, plan, ye);
  k::moe_combine(env.ctx, env.ffn, ye, r.weights, plan);
  env.capture("moe_out", l, env.ffn);
  shared_expert(env, l, normed2, out);
}

// One transformer layer on x (the layer's input, T x D): the attention block
// into h (returned), the FFN block into env.ffn; what backward needs goes
// into *a (workspace when a is null). moe_index: the layer's index among MoE
// layers (routing replay and recording).
Tensor run_layer(const LayerEnv& env, int64_t l, const Tensor& x, LayerActivations* a, int64_t moe_index,
                 bool write_kv) {
  const LayerBuffers out(a, env.ws);
  const AttentionOut att = attention_block(env, l, x, out, write_kv);
  if (env.weights.params().layers[static_cast<size_t>(l)].is_moe)
    moe_ffn(env, l, moe_index, att.normed2, out);
  else
    dense_ffn(env, l, att.normed2, out);
  return att.h;
}

// Every saved field of a layer but its input x_in.
std::vector<OwnedTensor*> recomputed_fields(LayerActivations& a) {
  return {&a.rstd1, &a.normed1, &a.q_pre,   &a.k_pre, &a.rstd_q, &a.rstd_k, &a.q,        &a.attn,   &a.lse,
          &a.h,     &a.rstd2,   &a.normed2, &a.gu,    &a.act,    &a.scores, &a.topk_idx, &a.topk_w, &a.xe,
          &a.gu_e,  &a.act_e,   &a.ye,      &a.gu_s,  &a.act_s,  &a.ys,     &a.sgate};
}

// Checks the options against the batch and the weights.
void check_options(const ModelWeights& weights, const RaggedBatch& batch, const ForwardOptions& opt,
                   const Activations* saved) {
  const ModelConfig& c = weights.config();
  LS_CHECK(!opt.save_activations || saved != nullptr) << "save_activations needs an Activations";
  LS_CHECK(opt.lm_head || opt.capture == nullptr) << "lm_head = false is for a forward without capture";
  const int64_t T = batch.num_tokens(), n_moe = c.num_moe_layers(), K = c.num_experts_per_tok;
  if (opt.replay_experts != nullptr) {
    LS_CHECK(static_cast<int64_t>(opt.replay_experts->size()) == T * n_moe * K)
        << "replay_experts has " << opt.replay_experts->size() << " entries, expected T*L_moe*K = " << T
        << "*" << n_moe << "*" << K;
  }
  if (n_moe > 0) {
    const ExpertShard want =
        opt.experts ? ExpertShard::of_rank(c.num_experts, opt.experts->size(), opt.experts->rank())
                    : ExpertShard{};
    LS_CHECK(weights.experts() == want)
        << "forward: the weights hold experts [" << weights.experts().first << ", "
        << weights.experts().first + weights.experts().count << ") (count -1: all), "
        << (opt.experts ? "this rank's expert-parallel shard is ["
                        : "a forward without expert parallelism needs all")
        << (opt.experts ? std::to_string(want.first) + ", " + std::to_string(want.first + want.count) + ")"
                        : "");
  }
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

void recompute_layer(const Context& ctx, const ModelWeights& weights, const KvCache& kv, Workspace& ws,
                     const RaggedBatch& batch, const BatchTensors& bt, const ForwardOptions& opt,
                     ForwardResult* result, int64_t l, int64_t moe_index, Activations& saved) {
  const CapturePoints capture(opt, batch, bt.positions);
  const k::AttentionBatch ab = bt.attention_batch();
  const LayerEnv env(ctx, weights, kv, ws, bt, ab, capture, opt, result);
  LayerActivations& a = saved.layers[static_cast<size_t>(l)];
  run_layer(env, l, a.x_in.view(), &a, moe_index, false);
}

// Buffers: what backward needs is computed straight into the saved
// Activations (activation_buffer), the rest into workspace slots, so a warm
// call allocates nothing and no activation is copied.
void forward(const Context& ctx, const ModelWeights& weights, KvCache& kv, Workspace& ws,
             const RaggedBatch& batch, const ForwardOptions& opt, ForwardResult* result, Activations* saved) {
  const ModelConfig& c = weights.config();
  if (c.is_v4()) {
    v4_forward(ctx, weights, kv, batch, opt, result, saved);
    return;
  }
  batch.validate(c, kv);
  check_options(weights, batch, opt, saved);
  const int64_t T = batch.num_tokens(), D = c.hidden_size, R = static_cast<int64_t>(batch.logit_rows.size());
  const bool save = opt.save_activations;
  if (opt.record_experts)
    result->routed_experts.assign(static_cast<size_t>(T * c.num_moe_layers() * c.num_experts_per_tok), 0);

  BatchTensors bt(batch, kv.block_size(), kernels::device_memory(ctx));
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
  auto layer_saved = [&](int64_t l) { return save ? &saved->layers[static_cast<size_t>(l)] : nullptr; };
  const DType f32 = DType::F32;

  // Residual stream entering layer 0: saved as its x_in.
  Tensor x =
      LayerBuffers(c.num_layers > 0 ? layer_saved(0) : nullptr, ws).get(&LA::x_in, kSlotX, f32, {T, D});
  k::embedding_forward(ctx, x, weights.params().embed, bt.tokens.view());
  capture("embed", -1, x);

  const k::AttentionBatch ab = bt.attention_batch();
  const LayerEnv env(ctx, weights, kv, ws, bt, ab, capture, opt, result);
  int64_t moe_index = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerActivations* a = layer_saved(l);
    const Tensor h = run_layer(env, l, x, a, moe_index, true);
    if (weights.params().layers[static_cast<size_t>(l)].is_moe) ++moe_index;
    capture("ffn_out", l, env.ffn);
    // x = h + ffn (one f32 add per element), into the next layer's saved
    // x_in when saving (the last layer's output goes to the workspace: only
    // its logit rows are kept).
    LayerActivations* next = l + 1 < c.num_layers ? layer_saved(l + 1) : nullptr;
    x = LayerBuffers(next, ws).get(&LA::x_in, kSlotX, f32, {T, D});
    add_into(ctx, x, h, env.ffn);
    capture("residual", l, x);
    // Recompute mode: only x_in is kept; the buffers go on to the next layer
    // (same shapes, no new allocation), and the last layer keeps them for
    // backward, which starts there.
    if (a && opt.recompute && next) pass_layer_buffers(*a, *next);
  }

  // Final norm on the wanted rows only, then the vocabulary projection.
  Tensor rows = activation_buffer(save ? &saved->x_final : nullptr, ws, kSlotRows, f32, {R, D});
  gather_rows(ctx, rows, x, batch.logit_rows);
  Tensor rows_normed =
      activation_buffer(save ? &saved->normed_rows : nullptr, ws, kSlotRowsNormed, f32, {R, D});
  Tensor rstd_f = activation_buffer(save ? &saved->rstd_f : nullptr, ws, kSlotRstdF, f32, {R});
  k::rmsnorm_forward(ctx, rows_normed, rstd_f, rows, weights.params().final_norm, float(c.rms_norm_eps));
  capture("final_norm", c.num_layers, rows_normed, true);
  if (!opt.lm_head) {
    keep_head_input(ctx, *result, rows_normed);
    return;
  }
  Tensor logits = reuse(ctx, result->logits, f32, {R, c.vocab_size});
  if (R > 0) project(ctx, logits, rows_normed, weights.lm_head());
  capture("logits", c.num_layers, logits, true);
}

void lm_head_forward(const Context& ctx, const ModelWeights& weights, Tensor logits, const Tensor& rows) {
  check_shape(logits, {rows.dim(0), weights.config().vocab_size}, "lm_head_forward: logits");
  if (rows.dim(0) > 0) project(ctx, logits, rows, weights.lm_head());
}

void lm_head_forward_cols(const Context& ctx, const ModelWeights& weights, Tensor logits, const Tensor& rows,
                          int64_t v0) {
  const kernels::PackedWeight& pw = weights.lm_head();
  const int64_t W = logits.dim(1);
  check_shape(logits, {rows.dim(0), -1}, "lm_head_forward_cols: logits");
  LS_CHECK(v0 >= 0 && v0 + W <= weights.config().vocab_size)
      << "lm_head_forward_cols: columns [" << v0 << ", " << v0 + W << ") outside the vocabulary";
  LS_CHECK(pw.storage != DType::FP8E4M3) << "lm_head_forward_cols: not for an fp8 head";
  if (rows.dim(0) == 0 || W == 0) return;
  // Every logit is one FMA chain over D of its row and its vocabulary row's
  // exact values (the packed kernel multiplies by the backward weights'
  // values): the rows [v0, v0 + W) of W alone give those chains.
  const Tensor w = weights.backward_params().lm_head.slice_rows(v0, v0 + W);
  if (pw.in_place()) {
    project(ctx, logits, rows, kernels::in_place_weight(w));
  } else {
    kernels::gemm_xwt(ctx, logits, rows, w);
  }
}

}  // namespace lockstep::model
