// The one forward function both engines call (docs/architecture.md principle 1): a
// ragged batch of sequences, each with some cached context and some new
// tokens. The trainer's forward is this function with every token new (and
// activations saved for backward); decode is this function with one new
// token per sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/model/expert_parallel.h"
#include "lockstep/model/kv_cache.h"
#include "lockstep/model/weights.h"
#include "lockstep/model/workspace.h"

namespace lockstep::model {

// S sequences; sequence i contributes n_new[i] new tokens at positions
// [n_ctx[i], n_ctx[i] + n_new[i]). The new tokens of all sequences are
// concatenated: T = sum(n_new) rows. Built with RaggedBatch(max_blocks) and one
// add_sequence per sequence; the caller then lists logit_rows.
struct RaggedBatch {
  std::vector<int32_t> tokens;       // (T)
  std::vector<int32_t> n_ctx;        // (S)
  std::vector<int32_t> n_new;        // (S)
  std::vector<int32_t> block_table;  // (S, max_blocks): physical KV block of each logical block
  int32_t max_blocks = 0;
  std::vector<int32_t> logit_rows;  // rows of T whose logits are wanted, ascending

  RaggedBatch() = default;
  // An empty batch whose block-table rows hold max_blocks entries (the most
  // blocks any of its sequences will use).
  explicit RaggedBatch(int32_t max_blocks) : max_blocks(max_blocks) {}

  // Appends a sequence: new_tokens[0, n_new) at positions [n_ctx, n_ctx + n_new),
  // its KV in blocks[0, n_blocks) (n_blocks <= max_blocks; the rest of its table
  // row is 0, never read). Returns the batch row of its first new token.
  int32_t add_sequence(const int32_t* new_tokens, int32_t n_new, int32_t n_ctx, const int32_t* blocks,
                       int32_t n_blocks);

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(n_new.size()); }
  // Checks sizes against each other and the cache; throws Error naming the field.
  void validate(const ModelConfig& config, const KvCache& kv) const;
};

// One named intermediate of a forward pass, handed to ForwardOptions::capture
// (the debug-callback idea of llama.cpp's ggml; docs/alignment.md, "Localising
// a divergence"). Row r of `data` is the token of batch sequence seq[r] at
// absolute position pos[r], so a decode-time row can be matched with the
// trainer's row for the same token. Points, in the order they are reached:
//   layer -1:  embed (T, D)
//   layer l:   attn_norm (T, D); q (T, H*Dh) after q-norm and RoPE; k (T, Hkv*Dh)
//              after k-norm and RoPE; v (T, Hkv*Dh) (k, v as written to the
//              cache); attn (T, H*Dh) attention output; attn_out (T, D) its
//              o_proj; attn_residual (T, D) x + attn_out; ffn_norm (T, D);
//              MoE layers only: router_logits (T, E), experts (T, K) i32,
//              expert_weights (T, K), moe_out (T, D) routed experts' sum,
//              shared_out (T, D) shared expert before its gate [shared experts];
//              ffn_out (T, D) the FFN's output; residual (T, D) the layer's output
//   layer L:   final_norm (R, D) and logits (R, V), rows = the batch's logit_rows
struct Captured {
  const char* name = nullptr;
  int64_t layer = 0;
  Tensor data;                        // (rows, cols) f32 ("experts": i32), contiguous
  const int32_t* seq = nullptr;       // (rows) index of the row's sequence in the batch
  const int32_t* pos = nullptr;       // (rows) absolute position of the row's token
  const uint64_t* seq_ids = nullptr;  // (S) ForwardOptions::capture_ids, or null

  int64_t rows() const { return data.dim(0); }
  int64_t cols() const { return data.dim(1); }
  // The caller's id of row r's sequence (its batch index without capture_ids).
  uint64_t id(int64_t r) const { return seq_ids ? seq_ids[seq[r]] : uint64_t(seq[r]); }
};
// Called on the forward's calling thread, between kernels. `data` is the live
// buffer: the forward goes on with whatever the callback leaves there (tests
// inject faults this way). The callback must not keep the pointers.
using CaptureFn = std::function<void(const Captured&)>;

struct ForwardOptions {
  bool save_activations = false;  // keep what backward needs (trainer)
  // With save_activations: keep only each layer's input; backward recomputes
  // the rest one layer at a time (activation memory of one layer instead of
  // all of them, for one more forward's work). The same bits either way.
  bool recompute = false;
  bool record_experts = false;  // fill ForwardResult::routed_experts
  // Routing replay (R3): (T, L_moe, K) experts to use instead of this router's
  // top-k; gate weights are still computed from this router's scores.
  const std::vector<int32_t>* replay_experts = nullptr;
  // DeepSeek-V4 only. record_indexer fills ForwardResult::indexer_topk;
  // replay_indexer (T, L_csa, KI), as recorded, replaces the lightning
  // indexer's top-k choice of compressed entries in the CSA (ratio 4) layers.
  bool record_indexer = false;
  const std::vector<int32_t>* replay_indexer = nullptr;
  // DeepSeek-V4 with MTP blocks, every token new: also run the MTP blocks and
  // fill ForwardResult::mtp_logits (the trainer's MTP loss).
  bool mtp = false;
  // DeepSeek-V4 training (every token new): the lightning indexer's KL loss
  // (docs/deepseek-v4.md) in each CSA layer: ForwardResult::indexer_kl, and
  // what backward needs for its gradient, saved with the activations.
  bool indexer_loss = false;
  // false: stop before the vocabulary projection. ForwardResult::logits is
  // left untouched and ForwardResult::head_input holds the (R, D) rows it
  // would project, so the caller can take logits a few rows at a time
  // (lm_head_forward) and never hold all (R, V) at once; with
  // save_activations, backward_from_head_input then starts from the
  // gradient of those rows. Not with capture (the "logits" point is never reached).
  bool lm_head = true;
  // Debug hook: called with every named intermediate (Captured). Null (the
  // default) costs one pointer test per capture point.
  const CaptureFn* capture = nullptr;
  // (S) the caller's id of each batch sequence, reported in Captured::seq_ids.
  const std::vector<uint64_t>* capture_ids = nullptr;
  // Expert parallelism (expert_parallel.h): the EP group this rank's MoE
  // layers exchange rows with; the weights must hold exactly this rank's
  // expert shard. Every rank of the group must run the same number of
  // forward (and backward) calls, an empty batch included. Null: this rank
  // runs every expert.
  ExpertComm* experts = nullptr;
};

struct ForwardResult {
  OwnedTensor logits;  // (R, V), R = logit_rows.size()
  // ForwardOptions::lm_head == false: (R, D) the final-normed logit rows,
  // the vocabulary projection's input (a copy: the forward's own buffers
  // may not outlive the call).
  OwnedTensor head_input;
  std::vector<int32_t> routed_experts;  // (T, L_moe, K) when record_experts
  // DeepSeek-V4, when record_indexer: (T, L_csa, KI) the compressed entries
  // (block indices, ascending, -1 padding) each token attended to in each CSA
  // layer (L_csa = layers with ratio 4, in layer order).
  std::vector<int32_t> indexer_topk;
  // ForwardOptions::mtp: per MTP block j, (R, V) logits of the batch's logit
  // rows; the row of position p predicts the token at p + j + 2.
  std::vector<OwnedTensor> mtp_logits;
  // ForwardOptions::indexer_loss: the sum over the CSA layers and the query
  // rows that see a compressed entry of KL(teacher || indexer), in order.
  double indexer_kl = 0;
};

struct V4Activations;  // DeepSeek-V4's saved activations (v4_forward.h)

// Everything one layer's backward needs.
struct LayerActivations {
  OwnedTensor x_in;     // (T, D) residual stream entering the layer
  OwnedTensor rstd1;    // (T)
  OwnedTensor normed1;  // (T, D)
  OwnedTensor q_pre;    // (T, H, Dh) before q-norm [qk_norm]
  OwnedTensor k_pre;    // (T, Hkv, Dh) before k-norm [qk_norm]
  OwnedTensor rstd_q;   // (T*H) [qk_norm]
  OwnedTensor rstd_k;   // (T*Hkv) [qk_norm]
  OwnedTensor q;        // (T, H, Dh) attention query (normed, rotated)
  OwnedTensor attn;     // (T, H*Dh) attention output
  OwnedTensor lse;      // (T, H)
  OwnedTensor h;        // (T, D) x_in + attention projection
  OwnedTensor rstd2;    // (T)
  OwnedTensor normed2;  // (T, D)
  // Dense FFN.
  OwnedTensor gu;   // (T, 2F) gate | up
  OwnedTensor act;  // (T, F)
  // MoE FFN.
  OwnedTensor scores;    // (T, E)
  OwnedTensor topk_idx;  // (T, K) i32
  OwnedTensor topk_w;    // (T, K)
  kernels::MoeDispatch plan;
  // The expert rows: this rank's T*K gathered rows in plan order, or with
  // expert parallelism the N rows the group sent to this rank's experts,
  // expert-major (route), while ye stays this rank's own T*K rows.
  ExpertRoute route;  // expert parallelism only
  OwnedTensor xe;     // (T*K or N, D) expert inputs
  OwnedTensor gu_e;   // (T*K or N, 2Fe)
  OwnedTensor act_e;  // (T*K or N, Fe)
  OwnedTensor ye;     // (T*K, D) expert outputs of this rank's rows
  OwnedTensor gu_s;   // (T, 2Fs) shared expert
  OwnedTensor act_s;  // (T, Fs)
  OwnedTensor ys;     // (T, D) shared expert output before its gate
  OwnedTensor sgate;  // (T) sigmoid of the shared-expert gate [shared_expert_gate]
};

struct Activations {
  std::vector<LayerActivations> layers;  // only x_in is kept when `recompute`
  bool recompute = false;
  std::vector<int32_t> replay;    // the forward's replay_experts, for the recompute
  ExpertComm* experts = nullptr;  // the forward's ForwardOptions::experts, for backward
  // With `experts`: when set, backward takes each routed expert's weight
  // gradient per source rank of its rows (the rows of one source micro-batch,
  // from zero gradients) and calls this after each with the expert's
  // gradient views, which it must fold away and leave zero
  // (TrainerConfig::world_invariant). It may run on several threads at once,
  // for different experts; ectx is the expert's context. Unset: one gradient
  // over the rows of every source.
  std::function<void(const MlpParams& grads, const Context& ectx)> fold_expert_grads;
  // Where backward accumulates the gradients of the weights' LoRA adapters
  // (ModelWeights::lora); required when the weights carry adapters.
  const LoraParams* lora_grads = nullptr;
  // DeepSeek-V4 with ForwardOptions::indexer_loss: the factor d(loss)/d(sum of
  // the rows' KL) that backward takes the indexer's gradient with (0: none).
  double indexer_loss_scale = 0;
  std::vector<int32_t> positions;     // (T)
  OwnedTensor x_final;                // (T, D)
  OwnedTensor rstd_f;                 // (T)
  OwnedTensor normed_rows;            // (R, D) final-normed rows fed to lm_head
  std::shared_ptr<V4Activations> v4;  // DeepSeek-V4 models: everything else above is unused
};

// Runs the model. New keys/values are written into `kv` (at the blocks the
// batch's table names) before attention reads them; temporaries live in `ws`,
// whose contents mean nothing after the call. `saved` must be non-null when
// options.save_activations is set.
void forward(const Context& ctx, const ModelWeights& weights, KvCache& kv, Workspace& ws,
             const RaggedBatch& batch, const ForwardOptions& options, ForwardResult* result,
             Activations* saved = nullptr);

// logits (n, V) = the vocabulary projection of rows (n, D) of
// ForwardResult::head_input. Each output row depends on its input row alone,
// so taking the rows in chunks gives the bits of forward's own (R, V) logits.
void lm_head_forward(const Context& ctx, const ModelWeights& weights, Tensor logits, const Tensor& rows);

// Backward of forward() for a batch whose n_ctx are all 0 (the training case).
// With expert parallelism (saved.experts) every rank of the EP group must
// call it after the matching forward, also for a batch without logit rows.
// dlogits (R, V) is the gradient of the loss w.r.t. result.logits. Gradients are
// accumulated (+=) into `grads` (views of a flat gradient buffer with the
// parameters' layout).
// With saved.recompute, each layer's activations are recomputed from its saved
// input (and freed again) as backward reaches it. `kv` holds the forward's
// keys and values (read only); `ws` may be the forward's workspace.
// dmtp_logits: DeepSeek-V4 with ForwardOptions::mtp, the gradient of each
// MTP block's logits (empty: none).
void backward(const Context& ctx, const ModelWeights& weights, const KvCache& kv, Workspace& ws,
              const RaggedBatch& batch, Activations& saved, const Tensor& dlogits, const ModelParams& grads,
              const std::vector<Tensor>& dmtp_logits = {});

// backward() for a forward run with ForwardOptions::lm_head == false: from
// dhead_input (R, D), the gradient w.r.t. ForwardResult::head_input, the
// caller having taken the vocabulary projection's backward itself (its dX
// from lm_head_backward_dx, its weight gradient from lm_head_backward_dw,
// before this call: the same order of additions into a tied embedding's
// gradient as backward's). The same bits as backward() from the dlogits
// whose projection gives dhead_input.
void backward_from_head_input(const Context& ctx, const ModelWeights& weights, const KvCache& kv,
                              Workspace& ws, const RaggedBatch& batch, Activations& saved,
                              const Tensor& dhead_input, const ModelParams& grads,
                              const std::vector<Tensor>& dmtp_logits = {});

// The vocabulary projection's backward a few rows or columns at a time:
// dx (n, D) = dlogits (n, V) · W for n rows (each row its own chain over V),
// and grads.lm_head[v0, v0 + W) += dlogitsᵀ · rows for vocabulary columns
// [v0, v0 + W) of every row (each column its own chain over the rows), with
// rows (R, D) the head input. lm_head_forward_cols: logits (R, W) = columns
// [v0, v0 + W) of lm_head_forward's logits, the same bits.
void lm_head_backward_dx(const Context& ctx, const ModelWeights& weights, Tensor dx, const Tensor& dlogits);
void lm_head_backward_dw(const Context& ctx, const ModelWeights& weights, const ModelParams& grads,
                         const Tensor& dlogits, const Tensor& rows, int64_t v0);
void lm_head_forward_cols(const Context& ctx, const ModelWeights& weights, Tensor logits, const Tensor& rows,
                          int64_t v0);

// Attention softmax scale 1/sqrt(Dh), computed once in double and rounded.
float attention_scale(const ModelConfig& c);

}  // namespace lockstep::model
