// DeepSeek-V4's forward and backward (docs/deepseek-v4.md): the same ragged
// batch, paged cache and options as every other architecture, so both engines
// call the one definition through model::forward / model::backward, which
// hand V4 models to the functions below.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/kernels/cpu/mhc.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/model/forward.h"

namespace lockstep::model {

// One mHC site's saved mixing values (kernels::MhcMix over owned memory).
struct MhcSaved {
  OwnedTensor raw, rstd, pre, post, comb;
  kernels::MhcMix view() const { return {raw.view(), rstd.view(), pre.view(), post.view(), comb.view()}; }
};

// The compressed entries one forward call completes in one layer (for one
// compressor): which token slots feed them and where they are stored.
struct EntryBatch {
  std::vector<int32_t> rows;  // (Ne, P) slots of the per-token store, -1 masked
  std::vector<int32_t> pos;   // (Ne) the entry's RoPE position: block index * ratio
  std::vector<int32_t> slot;  // (Ne) slot of the block's last token (where the entry is stored)
  int64_t count() const { return static_cast<int64_t>(pos.size()); }
};

// Everything one V4 layer's backward reads (Dimension letters: params.h and
// docs/deepseek-v4.md; n streams, M = 2n + n*n).
struct V4LayerActivations {
  OwnedTensor x_in;        // (T, n*D) streams entering the layer
  MhcSaved mix_attn;       // hc_attn
  OwnedTensor u_attn;      // (T, D) pre-mixed attention input
  OwnedTensor rstd_attn;   // (T)
  OwnedTensor a;           // (T, D) attn_norm(u_attn)
  OwnedTensor qa;          // (T, Rq) a · wq_aᵀ
  OwnedTensor rstd_qa;     // (T)
  OwnedTensor qr;          // (T, Rq) q_norm(qa)
  OwnedTensor q_pre;       // (T, H, Dh) qr · wq_bᵀ
  OwnedTensor rstd_q;      // (T*H) per-head RMS
  OwnedTensor q;           // (T, H, Dh) normalised and rotated
  OwnedTensor kv_pre;      // (T, Dh) a · wkvᵀ
  OwnedTensor rstd_kv;     // (T)
  EntryBatch entries;      // compressed entries completed by this batch (ratio > 0)
  OwnedTensor entry_pre;   // (Ne, Dh) compressor output before its norm
  OwnedTensor rstd_entry;  // (Ne)
  OwnedTensor cand;        // (T, C) i32 kv_store rows each query attends to
  OwnedTensor attn;        // (T, H, Dh) attention core output (before the inverse RoPE)
  OwnedTensor lse;         // (T, H)
  OwnedTensor o;           // (T, H*Dh) after the inverse RoPE
  OwnedTensor yo;          // (T, G*Ro) the grouped low-rank projection
  OwnedTensor f_attn;      // (T, D) attention output
  OwnedTensor x_mid;       // (T, n*D) streams after the attention's post-mix
  MhcSaved mix_ffn;        // hc_ffn
  OwnedTensor u_ffn;       // (T, D)
  OwnedTensor rstd_ffn;    // (T)
  OwnedTensor z;           // (T, D) ffn_norm(u_ffn)
  OwnedTensor scores;      // (T, E)
  OwnedTensor topk_idx;    // (T, K) i32
  OwnedTensor topk_w;      // (T, K)
  kernels::MoeDispatch plan;
  // The routed experts' rows: the plan's T*K rows, or with expert parallelism
  // the N rows of this rank's experts from the whole group (route.local, expert-major).
  ExpertRoute route;   // expert parallelism only
  OwnedTensor w_rows;  // (N, 1) expert parallelism: each row's routing weight
  OwnedTensor xe;      // (rows, D) gathered expert inputs
  OwnedTensor gu_e;    // (rows, 2Fe)
  OwnedTensor act_e;   // (rows, Fe) clamped SwiGLU
  OwnedTensor acts_e;  // (rows, Fe) times the routing weight (the down projection's input)
  // CSA layers with ForwardOptions::indexer_loss: the indexer's queries after
  // RoPE and head weights, the entries it chose, and softmax(scores) minus
  // the teacher over them (0 at padding).
  OwnedTensor idx_q;                // (T, HI, DI)
  OwnedTensor idx_w;                // (T, HI)
  std::vector<int32_t> idx_chosen;  // (T, KI) block indices, -1 padding
  OwnedTensor idx_dscore;           // (T, KI)
  OwnedTensor gu_s;        // (T, 2Fe) shared expert
  OwnedTensor act_s;       // (T, Fe)
  OwnedTensor f_ffn;       // (T, D) MoE output
};

// The head on the logit rows: hc_head mix, final norm, vocabulary projection.
struct V4HeadActivations {
  OwnedTensor x_rows;                       // (R, n*D) the logit rows' streams
  OwnedTensor head_w, head_raw, head_rstd;  // (R, n) (R, n) (R) hc_head
  OwnedTensor h_rows;                       // (R, D) head-mixed rows
  OwnedTensor rstd_f;                       // (R)
  OwnedTensor normed_rows;                  // (R, D) final-normed rows fed to the head
};

// MTP block j: position t's input is its depth-j streams (the main model's
// final streams for j = 0) and the embedding of the token j + 1 places on.
struct V4MtpActivations {
  std::vector<int32_t> next;  // (T) token t + j + 1 of t's sequence (0 past its end)
  OwnedTensor next_t;         // (T) i32, the same
  OwnedTensor e, rstd_e, en;  // (T, D) embed[next], (T), enorm(e)
  OwnedTensor h_in;           // (T, n*D) the streams entering
  OwnedTensor rstd_h, hn;     // (T*n) (T*n, D) hnorm of every stream
  V4LayerActivations block;   // x_in = h_proj(hn) + e_proj(en) on every stream
  OwnedTensor x_out;          // (T, n*D)
  V4HeadActivations head;
};

struct V4Activations {
  std::vector<V4LayerActivations> layers;
  std::vector<int32_t> slots;  // (T) each token's cache slot
  V4HeadActivations head;
  std::vector<V4MtpActivations> mtp;  // ForwardOptions::mtp
};

void v4_forward(const Context& ctx, const ModelWeights& weights, KvCache& kv, const RaggedBatch& batch,
                const ForwardOptions& options, ForwardResult* result, Activations* saved);

// 1 / sqrt(index_head_dim * index_n_heads): the factor of the indexer's head weights.
float indexer_head_scale(const ModelConfig& c);

// dhead: dlogits is the gradient of the main head's input (R, D), its
// vocabulary projection's backward taken by the caller (backward_from_head_input).
void v4_backward(const Context& ctx, const ModelWeights& weights, const KvCache& kv, const RaggedBatch& batch,
                 Activations& saved, const Tensor& dlogits, bool dhead, const ModelParams& grads,
                 const std::vector<Tensor>& dmtp_logits);

// Layer l's parameters: a main layer, or for l = L + j MTP block j's block.
inline const LayerParams& block_params(const ModelParams& m, int64_t l) {
  const size_t n = m.layers.size();
  return size_t(l) < n ? m.layers[size_t(l)] : m.mtp[size_t(l) - n].block;
}

// The mHC hyper-parameters of a config.
kernels::MhcConfig mhc_config(const ModelConfig& c);
// Layers with ratio 4 (CSA) before `layer`: the middle index of indexer tables.
int64_t csa_index(const ModelConfig& c, int64_t layer);
int64_t num_csa_layers(const ModelConfig& c);

}  // namespace lockstep::model
