// DeepSeek-V4 forward over a ragged batch and its paged cache: one code path
// for prefill, decode and the trainer. Every compressed entry is computed
// once, by the call whose tokens complete its block, from the per-token
// compressor inputs in the cache, and stored at the slot of the block's last
// token; queries then gather their candidates (window, compressed entries)
// from the cache. So a token's bits do not depend on how its sequence was cut
// into calls.
#include "lockstep/model/v4_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/embedding.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/kv_compress.h"
#include "lockstep/kernels/cpu/rmsnorm.h"
#include "lockstep/kernels/cpu/rope.h"
#include "lockstep/kernels/cpu/sparse_attention.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/kernels/cpu/v4_rows.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/forward_util.h"
#include "lockstep/model/v4_util.h"

namespace lockstep::model {

namespace k = lockstep::kernels;

kernels::MhcConfig mhc_config(const ModelConfig& c) {
  return {int(c.hc_mult), int(c.hc_sinkhorn_iters), float(c.hc_eps), float(c.rms_norm_eps)};
}

int64_t csa_index(const ModelConfig& c, int64_t layer) {
  int64_t n = 0;
  for (int64_t l = 0; l < layer; ++l) n += c.compress_ratio(l) == 4;
  return n;
}

int64_t num_csa_layers(const ModelConfig& c) {
  return csa_index(c, c.num_layers);
}

namespace {

const DType f32 = DType::F32;

// What every layer of one forward call shares.
struct V4Env {
  const Context& ctx;
  const ModelConfig& c;
  const ModelWeights& weights;
  KvCache& kv;
  const RaggedBatch& batch;
  const V4Batch& vb;
  const CapturePoints& capture;
  const ForwardOptions& opt;
  ForwardResult* result;
  int64_t T;
};

void mix_forward(const V4Env& env, MhcSaved& s, const Tensor& x, const Tensor& fn, const Tensor& base,
                 const Tensor& scale) {
  const int64_t T = env.T, n = env.c.hc_mult;
  reuse(env.ctx, s.raw, f32, {T, env.c.hc_mix_size()});
  reuse(env.ctx, s.rstd, f32, {T});
  reuse(env.ctx, s.pre, f32, {T, n});
  reuse(env.ctx, s.post, f32, {T, n});
  reuse(env.ctx, s.comb, f32, {T, n, n});
  k::mhc_mix_forward(env.ctx, s.view(), x, fn, base, scale, mhc_config(env.c));
}

// q (T, H, Dh): low-rank, q_norm, per-head unweighted RMS, RoPE on the tail.
void query(const V4Env& env, int64_t l, V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const int64_t T = env.T, H = c.num_heads, Dh = c.head_dim, Rq = c.q_lora_rank;
  const float eps = float(c.rms_norm_eps);
  const LayerParams& p = block_params(env.weights.params(), l);
  const PackedLayer& w = env.weights.layer(l);
  const LoraLayer* lora = v4_lora(env.weights, l);
  const float s = v4_lora_scale(env.weights);
  project(env.ctx, reuse(env.ctx, a.qa, f32, {T, Rq}), a.a.view(), w.wq_a);
  if (lora) lora_forward(env.ctx, a.qa.view(), a.a.view(), lora->wq_a, s);
  k::rmsnorm_forward(env.ctx, reuse(env.ctx, a.qr, f32, {T, Rq}), reuse(env.ctx, a.rstd_qa, f32, {T}),
                     a.qa.view(), p.q_a_norm, eps);
  project(env.ctx, reuse(env.ctx, a.q_pre, f32, {T, H, Dh}).reshape({T, H * Dh}), a.qr.view(), w.wq_b);
  if (lora) lora_forward(env.ctx, a.q_pre.view().reshape({T, H * Dh}), a.qr.view(), lora->wq_b, s);
  Tensor q = reuse(env.ctx, a.q, f32, {T, H, Dh});
  k::rmsnorm_forward(env.ctx, q.reshape({T * H, Dh}), reuse(env.ctx, a.rstd_q, f32, {T * H}),
                     a.q_pre.view().reshape({T * H, Dh}), env.weights.ones(), eps);
  k::rope_interleaved_forward(env.ctx, rope_tail(q, c.qk_rope_head_dim), env.vb.positions.view(),
                              env.weights.rope_of_layer(l));
  env.capture("q", l, q);
}

// The window key (= value) of every new token, into kv_store row 2*slot.
void window_kv(const V4Env& env, int64_t l, V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const int64_t T = env.T, Dh = c.head_dim;
  const LayerParams& p = block_params(env.weights.params(), l);
  project(env.ctx, reuse(env.ctx, a.kv_pre, f32, {T, Dh}), a.a.view(), env.weights.layer(l).wkv);
  if (const LoraLayer* lora = v4_lora(env.weights, l))
    lora_forward(env.ctx, a.kv_pre.view(), a.a.view(), lora->wkv, v4_lora_scale(env.weights));
  OwnedTensor kvn = device_tensor(env.ctx, f32, {T, 1, Dh});
  k::rmsnorm_forward(env.ctx, kvn.view().reshape({T, Dh}), reuse(env.ctx, a.rstd_kv, f32, {T}),
                     a.kv_pre.view(), p.kv_norm, float(c.rms_norm_eps));
  k::rope_interleaved_forward(env.ctx, rope_tail(kvn.view(), c.qk_rope_head_dim), env.vb.positions.view(),
                              env.weights.rope_of_layer(l));
  env.capture("k", l, kvn.view());
  store_rows(env.ctx, env.kv.kv_store(l), kvn.view().reshape({T, Dh}), env.vb.slots, 2, 0);
}

// The compressed entries this call completes in layer l (main compressor):
// the new tokens' [C | Z] into cz_store, then every completed block's entry
// (compress, norm, RoPE at its block's first position) into kv_store row
// 2*slot + 1 of the block's last token.
void compress_main(const V4Env& env, int64_t l, V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const int64_t ratio = c.compress_ratio(l), kappa = ratio == 4 ? 2 : 1, Dh = c.head_dim;
  const LayerParams& p = block_params(env.weights.params(), l);
  OwnedTensor cz = device_tensor(env.ctx, f32, {env.T, 2 * kappa * Dh});
  k::gemm_xwt(env.ctx, cz.view(), a.a.view(), env.weights.layer(l).cmp);
  store_rows(env.ctx, env.kv.cz_store(l), cz.view(), env.vb.slots, 1, 0);
  a.entries = completed_entries(env.batch, env.vb, ratio, ratio == 4);
  const int64_t Ne = a.entries.count();
  Tensor pre = reuse(env.ctx, a.entry_pre, f32, {Ne, Dh});
  OwnedTensor out = device_tensor(env.ctx, f32, {Ne, 1, Dh});
  if (Ne > 0) {
    const std::vector<int32_t>& rows = a.entries.rows;
    const OwnedTensor rows_t = device_i32(env.ctx, rows, {Ne, kappa * ratio});
    k::compress_forward(env.ctx, pre, env.kv.cz_store(l), rows_t.view(), p.cmp_ape, int(ratio), ratio == 4);
  }
  k::rmsnorm_forward(env.ctx, out.view().reshape({Ne, Dh}), reuse(env.ctx, a.rstd_entry, f32, {Ne}), pre,
                     p.cmp_norm, float(c.rms_norm_eps));
  const OwnedTensor pos = device_i32(env.ctx, a.entries.pos, {Ne});
  k::rope_interleaved_forward(env.ctx, rope_tail(out.view(), c.qk_rope_head_dim), pos.view(),
                              env.weights.rope_of_layer(l));
  store_rows(env.ctx, env.kv.kv_store(l), out.view().reshape({Ne, Dh}), a.entries.slot, 2, 1);
}

// The indexer's own compressor (CSA layers): its keys into index_keys.
void compress_index_keys(const V4Env& env, int64_t l, const Tensor& a) {
  const ModelConfig& c = env.c;
  const int64_t DI = c.index_head_dim;
  const LayerParams& p = block_params(env.weights.params(), l);
  OwnedTensor cz = device_tensor(env.ctx, f32, {env.T, 4 * DI});
  k::gemm_xwt(env.ctx, cz.view(), a, env.weights.layer(l).idx_cmp);
  store_rows(env.ctx, env.kv.index_cz(l), cz.view(), env.vb.slots, 1, 0);
  const EntryBatch e = completed_entries(env.batch, env.vb, 4, true);
  const int64_t Ne = e.count();
  OwnedTensor pre = device_tensor(env.ctx, f32, {Ne, DI}), rstd = device_tensor(env.ctx, f32, {Ne}),
              out = device_tensor(env.ctx, f32, {Ne, 1, DI});
  if (Ne > 0) {
    const OwnedTensor rows_t = device_i32(env.ctx, e.rows, {Ne, 8});
    k::compress_forward(env.ctx, pre.view(), env.kv.index_cz(l), rows_t.view(), p.idx_cmp_ape, 4, true);
  }
  k::rmsnorm_forward(env.ctx, out.view().reshape({Ne, DI}), rstd.view(), pre.view(), p.idx_cmp_norm,
                     float(c.rms_norm_eps));
  const OwnedTensor pos = device_i32(env.ctx, e.pos, {Ne});
  k::rope_interleaved_forward(env.ctx, rope_tail(out.view(), c.qk_rope_head_dim), pos.view(),
                              env.weights.rope_of_layer(l));
  store_rows(env.ctx, env.kv.index_keys(l), out.view().reshape({Ne, DI}), e.slot, 1, 0);
}

// The lightning indexer's queries qi (T, HI, DI), after RoPE, and head
// weights wt (T, HI), scaled, of CSA layer l.
void indexer_queries(const V4Env& env, int64_t l, const V4LayerActivations& a, Tensor qi, Tensor wt) {
  const ModelConfig& c = env.c;
  const int64_t T = env.T, HI = c.index_n_heads, DI = c.index_head_dim;
  const PackedLayer& w = env.weights.layer(l);
  k::gemm_xwt(env.ctx, qi.reshape({T, HI * DI}), a.qr.view(), w.idx_wq_b);
  k::rope_interleaved_forward(env.ctx, rope_tail(qi, c.qk_rope_head_dim), env.vb.positions.view(),
                              env.weights.rope_of_layer(l));
  k::gemm_xwt(env.ctx, wt, a.a.view(), w.idx_wproj);
  k::scale_values(env.ctx, wt, indexer_head_scale(c));
}

// The lightning indexer's choice (T, KI) of compressed entries (block
// indices, ascending, -1 padding) for each query of CSA layer l, or the
// replayed choice.
std::vector<int32_t> indexer_choice(const V4Env& env, int64_t l, const V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const int64_t T = env.T, HI = c.index_n_heads, DI = c.index_head_dim, KI = c.index_topk;
  std::vector<int32_t> chosen(size_t(T * KI), -1);
  if (env.opt.replay_indexer != nullptr) {
    const int64_t L_csa = num_csa_layers(c), j = csa_index(c, l);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < KI; ++s)
        chosen[size_t(t * KI + s)] = (*env.opt.replay_indexer)[size_t((t * L_csa + j) * KI + s)];
    check_replayed_entries(chosen, env.vb, 4, KI, l);
    return chosen;
  }
  OwnedTensor qi = device_tensor(env.ctx, f32, {T, HI, DI}), wt = device_tensor(env.ctx, f32, {T, HI});
  indexer_queries(env, l, a, qi.view(), wt.view());
  const VisibleEntries vis = visible_entries(env.batch, env.vb, 4);
  OwnedTensor sel = device_tensor(env.ctx, DType::I32, {T, KI});
  const OwnedTensor visible = device_i32(env.ctx, vis.rows, {vis.T, vis.C});
  k::indexer_select(env.ctx, sel.view(), Tensor(), qi.view(), wt.view(), env.kv.index_keys(l),
                    visible.view());
  if (!chosen.empty())
    k::device_memory(env.ctx).copy_out(chosen.data(), sel.view().data, chosen.size() * sizeof(int32_t));
  return chosen;
}

// The candidate kv_store rows of every query of layer l: its window, then the
// compressed entries it sees (all visible ones at ratio 128, the indexer's
// choice at ratio 4).
void candidates(const V4Env& env, int64_t l, V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const int64_t ratio = c.compress_ratio(l), KI = c.index_topk, T = env.T;
  std::vector<int32_t> chosen;
  if (ratio == 4) {
    chosen = indexer_choice(env, l, a);
    if (env.opt.record_indexer) {
      const int64_t L_csa = num_csa_layers(c), j = csa_index(c, l);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < KI; ++s)
          env.result->indexer_topk[size_t((t * L_csa + j) * KI + s)] = chosen[size_t(t * KI + s)];
    }
  }
  build_candidates(env.ctx, a.cand, env.batch, env.vb, c.sliding_window, ratio, chosen, KI);
  if (ratio == 4 && env.opt.indexer_loss) a.idx_chosen = chosen;
}

// The indexer loss of CSA layer l (ForwardOptions::indexer_loss; see
// docs/deepseek-v4.md). For each query and the compressed entries the
// indexer chose for it, the teacher is the attention's probability of each
// entry summed over the heads (the softmax's own denominator, window and
// sink included: exp(z - lse)), normalised over the chosen entries; the
// student is the softmax of the indexer's scores over them. Saves student -
// teacher (a.idx_dscore) and returns the sum over the rows of KL(teacher ||
// student), in token order. In double: the loss trains the indexer, it is
// not part of any aligned logprob.
double indexer_kl(const V4Env& env, int64_t l, V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const int64_t T = env.T, H = c.num_heads, Dh = c.head_dim, HI = c.index_n_heads, DI = c.index_head_dim,
                KI = c.index_topk, W = c.sliding_window;
  indexer_queries(env, l, a, reuse(env.ctx, a.idx_q, f32, {T, HI, DI}),
                  reuse(env.ctx, a.idx_w, f32, {T, HI}));
  // Computed on the host from copies of its inputs (host_readable: the
  // tensors themselves where the host may read them); ds goes back in one copy.
  std::vector<float> ds_host(size_t(T * KI), 0.0f);  // (T, KI)
  float* ds = ds_host.data();
  std::vector<unsigned char> keep_store, keep_keys, keep_cand, keep_q, keep_lse, keep_qi, keep_w;
  const Tensor store = k::host_readable(env.kv.kv_store(l), keep_store);
  const Tensor keys = k::host_readable(env.kv.index_keys(l), keep_keys);
  const Tensor cand_t = k::host_readable(a.cand.view(), keep_cand),
               q_t = k::host_readable(a.q.view(), keep_q);
  const Tensor lse_t = k::host_readable(a.lse.view(), keep_lse),
               qi_t = k::host_readable(a.idx_q.view(), keep_qi);
  const Tensor w_t = k::host_readable(a.idx_w.view(), keep_w);
  const double scale = attention_scale(c);
  std::vector<double> row_kl(size_t(T), 0.0);
  env.ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<double> teacher(static_cast<size_t>(KI)), student(static_cast<size_t>(KI));
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t p = env.vb.positions_vec[size_t(t)], s = env.vb.seq[size_t(t)];
          const int64_t first = std::min(W, p + 1);  // the window's columns come first
          const int32_t* cand = cand_t.i32() + t * cand_t.dim(1);
          int64_t n = 0;
          while (n < KI && a.idx_chosen[size_t(t * KI + n)] >= 0) ++n;
          if (n == 0) continue;
          double tsum = 0, smax = -1e300;
          for (int64_t k = 0; k < n; ++k) {
            const float* kv = store.f32() + int64_t(cand[first + k]) * Dh;
            const float* key =
                keys.f32() + int64_t(env.vb.slot(s, (a.idx_chosen[size_t(t * KI + k)] + 1) * 4 - 1)) * DI;
            double tk = 0, sk = 0;
            for (int64_t h = 0; h < H; ++h) {
              const float* q = q_t.f32() + (t * H + h) * Dh;
              double z = 0;
              for (int64_t d = 0; d < Dh; ++d) z += double(q[d]) * double(kv[d]);
              tk += std::exp(z * scale - double(lse_t.f32()[t * H + h]));
            }
            for (int64_t h = 0; h < HI; ++h) {
              const float* qi = qi_t.f32() + (t * HI + h) * DI;
              double u = 0;
              for (int64_t d = 0; d < DI; ++d) u += double(qi[d]) * double(key[d]);
              sk += double(w_t.f32()[t * HI + h]) * std::max(0.0, u);
            }
            teacher[size_t(k)] = tk;
            student[size_t(k)] = sk;
            tsum += tk;
            smax = std::max(smax, sk);
          }
          double ssum = 0;
          for (int64_t k = 0; k < n; ++k) ssum += std::exp(student[size_t(k)] - smax);
          double kl = 0;
          for (int64_t k = 0; k < n; ++k) {
            const double tau = teacher[size_t(k)] / tsum;
            const double log_sigma = student[size_t(k)] - smax - std::log(ssum);
            if (tau > 0) kl += tau * (std::log(tau) - log_sigma);
            ds[t * KI + k] = float(std::exp(log_sigma) - tau);
          }
          row_kl[size_t(t)] = kl;
        }
      },
      16);
  Tensor dscore = reuse(env.ctx, a.idx_dscore, f32, {T, KI});
  if (!ds_host.empty()) k::device_memory(env.ctx).copy_in(dscore.data, ds, ds_host.size() * sizeof(float));
  double total = 0;
  for (double x : row_kl) total += x;
  return total;
}

// Layer l's attention on the pre-mixed input: f_attn (T, D).
void attention(const V4Env& env, int64_t l, V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const int64_t T = env.T, D = c.hidden_size, H = c.num_heads, Dh = c.head_dim, G = c.o_groups,
                Ro = c.o_lora_rank;
  const LayerParams& p = block_params(env.weights.params(), l);
  const PackedLayer& w = env.weights.layer(l);
  k::rmsnorm_forward(env.ctx, reuse(env.ctx, a.a, f32, {T, D}), reuse(env.ctx, a.rstd_attn, f32, {T}),
                     a.u_attn.view(), p.attn_norm, float(c.rms_norm_eps));
  env.capture("attn_norm", l, a.a.view());
  query(env, l, a);
  window_kv(env, l, a);
  const int64_t ratio = c.compress_ratio(l);
  if (ratio > 0) compress_main(env, l, a);
  if (ratio == 4) compress_index_keys(env, l, a.a.view());
  candidates(env, l, a);
  Tensor attn = reuse(env.ctx, a.attn, f32, {T, H, Dh});
  k::sparse_attention_forward(env.ctx, attn, reuse(env.ctx, a.lse, f32, {T, H}), a.q.view(),
                              env.kv.kv_store(l), a.cand.view(), p.attn_sink, attention_scale(c));
  if (env.opt.indexer_loss && c.compress_ratio(l) == 4) env.result->indexer_kl += indexer_kl(env, l, a);
  Tensor o = reuse(env.ctx, a.o, f32, {T, H * Dh});
  if (T > 0) k::device_memory(env.ctx).copy(o.data, attn.data, attn.nbytes());
  k::rope_interleaved_inverse(env.ctx, rope_tail(o.reshape({T, H, Dh}), c.qk_rope_head_dim),
                              env.vb.positions.view(), env.weights.rope_of_layer(l));
  env.capture("attn", l, o);
  // Grouped low-rank output: group g's heads through wo_a[g], then wo_b.
  const int64_t per_group = H * Dh / G;
  Tensor yo = reuse(env.ctx, a.yo, f32, {T, G * Ro});
  for (int64_t g = 0; g < G; ++g)
    project(env.ctx, yo.slice_cols(g * Ro, (g + 1) * Ro), o.slice_cols(g * per_group, (g + 1) * per_group),
            w.wo_a[size_t(g)]);
  project(env.ctx, reuse(env.ctx, a.f_attn, f32, {T, D}), yo, w.wo_b);
  if (const LoraLayer* lora = v4_lora(env.weights, l))
    lora_forward(env.ctx, a.f_attn.view(), yo, lora->wo_b, v4_lora_scale(env.weights));
  env.capture("attn_out", l, a.f_attn.view());
}

// The routing of MoE layer l: hash layers take their token's tid2eid row,
// the others the router's top-k (or the replayed experts).
void route(const V4Env& env, int64_t l, V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const int64_t T = env.T, E = c.num_experts, K = c.num_experts_per_tok;
  const LayerParams& p = block_params(env.weights.params(), l);
  OwnedTensor logits = device_tensor(env.ctx, f32, {T, E}), replay;
  k::gemm_xwt(env.ctx, logits.view(), a.z.view(), env.weights.layer(l).router);
  env.capture("router_logits", l, logits.view());
  const bool main_layer = l < c.num_layers;  // MTP blocks are neither replayed nor recorded
  if (c.is_hash_layer(l)) {
    replay = device_tensor(env.ctx, DType::I32, {T, K});
    hash_experts(env.ctx, replay.view(), p.tid2eid, env.vb.tokens, K);
  } else if (env.opt.replay_experts != nullptr && main_layer) {
    replay = device_tensor(env.ctx, DType::I32, {T, K});
    gather_layer_experts(env.ctx, replay.view(), *env.opt.replay_experts, l, c.num_moe_layers(), K);
  }
  k::moe_route(env.ctx, reuse(env.ctx, a.topk_idx, DType::I32, {T, K}), reuse(env.ctx, a.topk_w, f32, {T, K}),
               reuse(env.ctx, a.scores, f32, {T, E}), logits.view(), p.router_bias, replay.view(),
               router_config(c));
  env.capture("experts", l, a.topk_idx.view());
  env.capture("expert_weights", l, a.topk_w.view());
  if (env.opt.record_experts && main_layer)
    scatter_layer_experts(env.result->routed_experts, a.topk_idx.view(), l, c.num_moe_layers(), K);
}

// The first half of an expert on rows x: gu = x · w_gate_upᵀ (plus the w1,
// w3 adapters of lora, if any), act = the clamped SwiGLU.
void expert_act(const Context& ctx, const ModelConfig& c, Tensor gu, Tensor act, const Tensor& x,
                const PackedMlp& w, const LoraMlp* lora, float s) {
  const int64_t F = act.dim(1);
  project(ctx, gu, x, w.gate_up);
  if (lora) {
    lora_forward(ctx, gu.slice_cols(0, F), x, lora->gate, s);
    lora_forward(ctx, gu.slice_cols(F, 2 * F), x, lora->up, s);
  }
  swiglu_v4(ctx, act, gu.slice_cols(0, F), gu.slice_cols(F, 2 * F), c.swiglu_limit);
}

// The routed experts on rows x (rows, D) of `rows` (a dispatch plan, or an
// expert route's local rows), w their routing weights (as rows.top_k columns
// per rows.num_tokens): gu, act and acts (saved) and y (rows, D).
void expert_rows_forward(const V4Env& env, int64_t l, const k::MoeDispatch& rows, const Tensor& x,
                         const Tensor& w, V4LayerActivations& a, Tensor y) {
  const ModelConfig& c = env.c;
  const Context& ctx = env.ctx;
  const int64_t R = x.dim(0), Fe = c.moe_intermediate_size;
  const PackedLayer& pw = env.weights.layer(l);
  const LoraLayer* lora = v4_lora(env.weights, l);
  const float s = v4_lora_scale(env.weights);
  Tensor gu = reuse(env.ctx, a.gu_e, f32, {R, 2 * Fe});
  Tensor act = reuse(env.ctx, a.act_e, f32, {R, Fe}), acts = reuse(env.ctx, a.acts_e, f32, {R, Fe});
  for_each_expert(ctx, rows, [&](int64_t e, const Context& ectx) {
    const int64_t r0 = rows.offsets[size_t(e)], r1 = rows.offsets[size_t(e) + 1];
    expert_act(ectx, c, gu.slice_rows(r0, r1), act.slice_rows(r0, r1), x.slice_rows(r0, r1),
               pw.experts[size_t(e)], lora_expert(lora, e), s);
  });
  // The routing weight multiplies each row before the down projection.
  k::moe_scale_rows(ctx, acts, act, w, rows);
  for_each_expert(ctx, rows, [&](int64_t e, const Context& ectx) {
    const int64_t r0 = rows.offsets[size_t(e)], r1 = rows.offsets[size_t(e) + 1];
    project(ectx, y.slice_rows(r0, r1), acts.slice_rows(r0, r1), pw.experts[size_t(e)].down);
    if (const LoraMlp* le = lora_expert(lora, e))
      lora_forward(ectx, y.slice_rows(r0, r1), acts.slice_rows(r0, r1), le->down, s);
  });
}

// ye (T*K, D) = each routed row of layer l through its expert. With expert
// parallelism the rows and their routing weights travel to the experts'
// owners, the rows of this rank's experts arrive from the whole group, and
// their outputs travel back (model/expert_parallel.h): each row's output has
// the bits one process gives it.
void routed_experts(const V4Env& env, int64_t l, V4LayerActivations& a, Tensor ye) {
  const Context& ctx = env.ctx;
  const int64_t T = env.T, D = env.c.hidden_size, K = env.c.num_experts_per_tok;
  const k::MoeDispatch& plan = a.plan;
  if (env.opt.experts == nullptr) {
    Tensor xe = reuse(env.ctx, a.xe, f32, {T * K, D});
    k::moe_gather(ctx, xe, a.z.view(), plan);
    expert_rows_forward(env, l, plan, xe, a.topk_w.view(), a, ye);
    return;
  }
  ExpertComm& comm = *env.opt.experts;
  a.route = expert_route(comm, plan, env.weights.experts());
  const int64_t N = a.route.num_in();
  OwnedTensor xs = device_tensor(env.ctx, f32, {T * K, D}), ws = device_tensor(env.ctx, f32, {T * K, 1}),
              stage = device_tensor(env.ctx, f32, {N, D}), stage_w = device_tensor(env.ctx, f32, {N, 1}),
              yr = device_tensor(env.ctx, f32, {N, D});
  k::moe_gather(ctx, xs.view(), a.z.view(), plan);
  k::moe_row_weights(ctx, ws.view(), a.topk_w.view(), plan);
  Tensor xe = reuse(env.ctx, a.xe, f32, {N, D}), wr = reuse(env.ctx, a.w_rows, f32, {N, 1});
  expert_dispatch(ctx, comm, a.route, xs.view(), xe, stage.view());
  expert_dispatch(ctx, comm, a.route, ws.view(), wr, stage_w.view());
  expert_rows_forward(env, l, a.route.local, xe, wr, a, yr.view());
  expert_return(ctx, comm, a.route, yr.view(), ye, stage.view());
}

// Layer l's MoE on the pre-mixed input: f_ffn (T, D).
void moe(const V4Env& env, int64_t l, V4LayerActivations& a) {
  const ModelConfig& c = env.c;
  const Context& ctx = env.ctx;
  const int64_t T = env.T, D = c.hidden_size, K = c.num_experts_per_tok, Fe = c.moe_intermediate_size;
  const LayerParams& p = block_params(env.weights.params(), l);
  const PackedLayer& w = env.weights.layer(l);
  k::rmsnorm_forward(ctx, reuse(env.ctx, a.z, f32, {T, D}), reuse(env.ctx, a.rstd_ffn, f32, {T}),
                     a.u_ffn.view(), p.mlp_norm, float(c.rms_norm_eps));
  env.capture("ffn_norm", l, a.z.view());
  route(env, l, a);
  a.plan = k::moe_plan(a.topk_idx.view(), int(c.num_experts));
  OwnedTensor ye = device_tensor(env.ctx, f32, {T * K, D});
  routed_experts(env, l, a, ye.view());
  Tensor f = reuse(env.ctx, a.f_ffn, f32, {T, D});
  k::moe_sum(ctx, f, ye.view(), a.plan);
  env.capture("moe_out", l, f);
  // The shared expert: the same clamp, no routing weight.
  OwnedTensor ys = device_tensor(env.ctx, f32, {T, D});
  const LoraLayer* lora = v4_lora(env.weights, l);
  const float s = v4_lora_scale(env.weights);
  expert_act(ctx, c, reuse(env.ctx, a.gu_s, f32, {T, 2 * Fe}), reuse(env.ctx, a.act_s, f32, {T, Fe}),
             a.z.view(), w.shared, lora ? &lora->shared : nullptr, s);
  project(ctx, ys.view(), a.act_s.view(), w.shared.down);
  if (lora) lora_forward(ctx, ys.view(), a.act_s.view(), lora->shared.down, s);
  env.capture("shared_out", l, ys.view());
  add_into(ctx, f, f, ys.view());
  env.capture("ffn_out", l, f);
}

// One block: attention and MoE, each between an mHC pre-mix and post-mix.
// x (T, n*D) in; returns the streams out (next layer's x_in when saving).
void run_layer(const V4Env& env, int64_t l, V4LayerActivations& a, Tensor x_out) {
  const ModelConfig& c = env.c;
  const Context& ctx = env.ctx;
  const int64_t T = env.T, D = c.hidden_size, n = c.hc_mult;
  const LayerParams& p = block_params(env.weights.params(), l);
  const Tensor x = a.x_in.view();
  mix_forward(env, a.mix_attn, x, p.hc_attn_fn, p.hc_attn_base, p.hc_attn_scale);
  k::mhc_pre_apply(ctx, reuse(env.ctx, a.u_attn, f32, {T, D}), x, a.mix_attn.pre.view(), int(n));
  attention(env, l, a);
  Tensor mid = reuse(env.ctx, a.x_mid, f32, {T, n * D});
  k::mhc_post(ctx, mid, a.f_attn.view(), x, a.mix_attn.post.view(), a.mix_attn.comb.view(), int(n));
  env.capture("attn_residual", l, mid);
  mix_forward(env, a.mix_ffn, mid, p.hc_ffn_fn, p.hc_ffn_base, p.hc_ffn_scale);
  k::mhc_pre_apply(ctx, reuse(env.ctx, a.u_ffn, f32, {T, D}), mid, a.mix_ffn.pre.view(), int(n));
  moe(env, l, a);
  k::mhc_post(ctx, x_out, a.f_ffn.view(), mid, a.mix_ffn.post.view(), a.mix_ffn.comb.view(), int(n));
  env.capture("residual", l, x_out);
}

void check_v4_options(const ModelWeights& weights, const RaggedBatch& batch, const ForwardOptions& opt,
                      const Activations* saved) {
  const ModelConfig& c = weights.config();
  LS_CHECK(!opt.save_activations || saved != nullptr) << "save_activations needs an Activations";
  LS_CHECK(opt.lm_head || opt.capture == nullptr) << "lm_head = false is for a forward without capture";
  if (opt.indexer_loss) {
    LS_CHECK(opt.save_activations) << "ForwardOptions::indexer_loss needs save_activations";
    for (int32_t n_ctx : batch.n_ctx)
      LS_CHECK(n_ctx == 0) << "ForwardOptions::indexer_loss needs every token new (n_ctx == 0)";
  }
  if (opt.mtp) {
    LS_CHECK(c.num_nextn_predict_layers > 0) << "ForwardOptions::mtp: the model has no MTP block";
    for (int32_t n_ctx : batch.n_ctx)
      LS_CHECK(n_ctx == 0) << "ForwardOptions::mtp needs every token new (n_ctx == 0)";
  }
  const int64_t T = batch.num_tokens();
  if (opt.replay_experts != nullptr) {
    LS_CHECK(int64_t(opt.replay_experts->size()) == T * c.num_moe_layers() * c.num_experts_per_tok)
        << "replay_experts has " << opt.replay_experts->size() << " entries, expected T*L_moe*K = " << T
        << "*" << c.num_moe_layers() << "*" << c.num_experts_per_tok;
  }
  if (opt.replay_indexer != nullptr) {
    LS_CHECK(int64_t(opt.replay_indexer->size()) == T * num_csa_layers(c) * c.index_topk)
        << "replay_indexer has " << opt.replay_indexer->size() << " entries, expected T*L_csa*KI = " << T
        << "*" << num_csa_layers(c) << "*" << c.index_topk;
  }
}

// A head on the logit rows of streams x: hc_head mix (fn, base, scale), norm,
// vocabulary projection into logits (R, V).
void head_forward(const V4Env& env, const Tensor& x, V4HeadActivations& s, const Tensor& fn,
                  const Tensor& base, const Tensor& scale, const Tensor& norm, OwnedTensor& logits_out,
                  int64_t layer) {
  const ModelConfig& c = env.c;
  const int64_t R = int64_t(env.batch.logit_rows.size()), D = c.hidden_size, n = c.hc_mult;
  Tensor rows = reuse(env.ctx, s.x_rows, f32, {R, n * D});
  gather_rows(env.ctx, rows, x, env.batch.logit_rows);
  Tensor h = reuse(env.ctx, s.h_rows, f32, {R, D});
  k::mhc_head_forward(env.ctx, h, reuse(env.ctx, s.head_w, f32, {R, n}),
                      reuse(env.ctx, s.head_raw, f32, {R, n}), reuse(env.ctx, s.head_rstd, f32, {R}), rows,
                      fn, base, scale, mhc_config(c));
  Tensor normed = reuse(env.ctx, s.normed_rows, f32, {R, D});
  k::rmsnorm_forward(env.ctx, normed, reuse(env.ctx, s.rstd_f, f32, {R}), h, norm, float(c.rms_norm_eps));
  env.capture("final_norm", layer, normed, true);
  if (!env.opt.lm_head && layer == c.num_layers) {  // the main head; MTP heads project as always
    keep_head_input(env.ctx, *env.result, normed);
    return;
  }
  Tensor logits = reuse(env.ctx, logits_out, f32, {R, c.vocab_size});
  if (R > 0) project(env.ctx, logits, normed, env.weights.lm_head());
  env.capture("logits", layer, logits, true);
}

// The MTP blocks (ForwardOptions::mtp), each on the previous depth's streams
// (the main model's final streams x first) and the embeddings of the tokens
// one place further on; their logits into result->mtp_logits.
void mtp_forward(const V4Env& env, const Tensor& x, V4Activations& s) {
  const ModelConfig& c = env.c;
  const Context& ctx = env.ctx;
  const int64_t T = env.T, D = c.hidden_size, n = c.hc_mult, L = c.num_layers;
  const float eps = float(c.rms_norm_eps);
  s.mtp.resize(size_t(c.num_nextn_predict_layers));
  env.result->mtp_logits.resize(s.mtp.size());
  Tensor h = x;
  for (size_t j = 0; j < s.mtp.size(); ++j) {
    V4MtpActivations& m = s.mtp[j];
    const MtpParams& p = env.weights.params().mtp[j];
    const PackedMtp& w = env.weights.mtp(int64_t(j));
    m.next = shifted_tokens(env.batch, int64_t(j) + 1);
    m.next_t = device_i32(env.ctx, m.next, {T});
    k::embedding_forward(ctx, reuse(env.ctx, m.e, f32, {T, D}), env.weights.params().embed, m.next_t.view());
    k::rmsnorm_forward(ctx, reuse(env.ctx, m.en, f32, {T, D}), reuse(env.ctx, m.rstd_e, f32, {T}), m.e.view(),
                       p.enorm, eps);
    Tensor h_in = reuse(env.ctx, m.h_in, f32, {T, n * D});
    if (T > 0) k::device_memory(ctx).copy(h_in.data, h.data, h_in.nbytes());
    k::rmsnorm_forward(ctx, reuse(env.ctx, m.hn, f32, {T * n, D}), reuse(env.ctx, m.rstd_h, f32, {T * n}),
                       h_in.reshape({T * n, D}), p.hnorm, eps);
    OwnedTensor pe = device_tensor(env.ctx, f32, {T, D});
    project(ctx, pe.view(), m.en.view(), w.e_proj);
    Tensor x0 = reuse(env.ctx, m.block.x_in, f32, {T, n * D});
    project(ctx, x0.reshape({T * n, D}), m.hn.view(), w.h_proj);
    add_to_streams(ctx, x0, pe.view(), n);
    Tensor out = reuse(env.ctx, m.x_out, f32, {T, n * D});
    run_layer(env, L + int64_t(j), m.block, out);
    head_forward(env, out, m.head, p.hc_head_fn, p.hc_head_base, p.hc_head_scale, p.norm,
                 env.result->mtp_logits[j], L + int64_t(j) + 1);
    h = out;
  }
}

}  // namespace

float indexer_head_scale(const ModelConfig& c) {
  return float(1.0 / std::sqrt(double(c.index_head_dim) * double(c.index_n_heads)));
}

void v4_forward(const Context& ctx, const ModelWeights& weights, KvCache& kv, const RaggedBatch& batch,
                const ForwardOptions& opt, ForwardResult* result, Activations* saved) {
  const ModelConfig& c = weights.config();
  batch.validate(c, kv);
  check_v4_options(weights, batch, opt, saved);
  const int64_t T = batch.num_tokens(), D = c.hidden_size, n = c.hc_mult;
  if (opt.record_experts)
    result->routed_experts.assign(size_t(T * c.num_moe_layers() * c.num_experts_per_tok), 0);
  if (opt.record_indexer) result->indexer_topk.assign(size_t(T * num_csa_layers(c) * c.index_topk), -1);
  if (result != nullptr) result->indexer_kl = 0;

  const V4Batch vb(ctx, batch, kv.block_size());
  const CapturePoints capture(opt, batch, vb.positions_vec);
  std::shared_ptr<V4Activations> keep;
  if (opt.save_activations) {
    if (!saved->v4) saved->v4 = std::make_shared<V4Activations>();
    keep = saved->v4;
    saved->positions = vb.positions_vec;
    saved->experts = opt.experts;
  } else {
    keep = std::make_shared<V4Activations>();
  }
  V4Activations& s = *keep;
  s.slots = vb.slots;
  // Only the current layer is kept unless saving for backward.
  s.layers.resize(opt.save_activations ? size_t(c.num_layers) : 1);
  auto layer_acts = [&](int64_t l) -> V4LayerActivations& {
    return s.layers[opt.save_activations ? size_t(l) : 0];
  };

  // The n streams start as copies of the embedding.
  OwnedTensor e = device_tensor(ctx, f32, {T, D});
  k::embedding_forward(ctx, e.view(), weights.params().embed, vb.tokens_t.view());
  capture("embed", -1, e.view());
  Tensor x = reuse(ctx, layer_acts(0).x_in, f32, {T, n * D});
  repeat_streams(ctx, x, e.view(), n);

  const V4Env env{ctx, c, weights, kv, batch, vb, capture, opt, result, T};
  OwnedTensor last = device_tensor(env.ctx, f32, {T, n * D}), next;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    V4LayerActivations& a = layer_acts(l);
    const bool final_layer = l + 1 == c.num_layers;
    Tensor out = final_layer            ? last.view()
                 : opt.save_activations ? reuse(env.ctx, s.layers[size_t(l) + 1].x_in, f32, {T, n * D})
                                        : reuse(env.ctx, next, f32, {T, n * D});
    run_layer(env, l, a, out);
    // Without saving, one set of buffers serves every layer: the output
    // becomes the next layer's input.
    if (!final_layer && !opt.save_activations) std::swap(a.x_in, next);
  }
  const ModelParams& mp = weights.params();
  head_forward(env, last.view(), s.head, mp.hc_head_fn, mp.hc_head_base, mp.hc_head_scale, mp.final_norm,
               result->logits, c.num_layers);
  if (opt.mtp) mtp_forward(env, last.view(), s);
  if (!opt.save_activations) s.layers.clear();
}

}  // namespace lockstep::model
