// Model parameters as ONE flat f32 buffer (docs/architecture.md principle 3): ParamLayout
// is the name table (Hugging Face tensor names, shapes, offsets), and bind()
// lays typed per-layer Tensor views over any buffer of the layout's size, so
// the same layout serves parameters, gradients and AdamW moments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/config.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep {

// How init_params fills a tensor.
enum class ParamKind {
  Matrix,  // normal(0, std): projections, embeddings, routers, gates
  Norm,    // ones: RMSNorm weights
  Bias,    // zeros: q/k/v biases, score-correction bias
  Index,   // an integer table (DeepSeek-V4 tid2eid): int32 bit patterns in the
           // flat buffer, never a float; not trained, saved as I64
};

struct ParamInfo {
  std::string name;            // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // PyTorch Linear convention: (out_features, in_features)
  int64_t offset = 0;          // in floats from the buffer start
  int64_t numel = 0;
  ParamKind kind = ParamKind::Matrix;
  int64_t layer = -1;   // decoder layer of a per-layer tensor; -1: embedding, final norm, LM head
  int64_t expert = -1;  // routed expert of an expert projection; -1: any other tensor
  // Backward writes no gradient and the optimizer leaves it unchanged
  // (Index tables; DeepSeek-V4's lightning indexer, trained only by its own loss).
  bool frozen = false;
  // Saved as F32 whatever the checkpoint dtype (DeepSeek-V4's mHC mixes,
  // attention sinks, router bias, compressor position bias).
  bool keep_f32 = false;
  bool routed_expert() const { return expert >= 0; }
};

// A range of a flat parameter buffer, in floats.
struct ParamRange {
  int64_t offset = 0;
  int64_t numel = 0;
};

// One MoE layer's routed experts in a layout: every held expert's gate|up
// rows, then every held expert's down rows (the order below), two ranges.
struct ExpertBlocks {
  ParamRange gate_up;
  ParamRange down;
};

// Tensors are packed back to back in this order (no padding, so the views
// cover the buffer exactly):
//   model.embed_tokens.weight                                   (V, D)
//   per layer i, in layer order (each layer is one contiguous range):
//     input_layernorm.weight                                    (D)
//     self_attn.{q,k,v}_proj.weight                             (H*Dh, D) (Hkv*Dh, D) (Hkv*Dh, D)
//     self_attn.{q,k,v}_proj.bias        [qkv_bias]             (H*Dh) (Hkv*Dh) (Hkv*Dh)
//     self_attn.{q,k}_norm.weight        [qk_norm]              (Dh) (Dh)
//     self_attn.o_proj.weight                                   (D, H*Dh)
//     post_attention_layernorm.weight                           (D)
//     dense layer: mlp.{gate,up,down}_proj.weight               (F, D) (F, D) (D, F)
//     MoE layer:   mlp.gate.weight                              (E, D)  router
//                  mlp.gate.e_score_correction_bias [score_correction_bias] (E)
//                  mlp.experts.{e}.gate_proj, .up_proj for e = 0..E-1, interleaved
//                                                               (Fe, D) (Fe, D) each
//                  mlp.experts.{e}.down_proj for e = 0..E-1     (D, Fe) each
//                  mlp.shared_expert(s).{gate,up,down}_proj     (Fs, D) (Fs, D) (D, Fs)
//                  mlp.shared_expert_gate.weight [Qwen2-MoE]    (1, D)
//   model.norm.weight                                           (D)
//   lm_head.weight                       [not tied]             (V, D)
// Consequences: q, k, v rows are adjacent, so wqkv is one ((H+2Hkv)*Dh, D)
// matrix (and bqkv one vector); an expert's gate rows are followed by its up
// rows, so w_gate_up is one (2Fe, D) matrix and all experts' gate/up form one
// (E, 2Fe, D) tensor and their downs one (E, D, Fe) tensor (the layout of the
// fused expert parameters in transformers >= 5 and of grouped GEMMs).
// The shared expert is named `shared_expert` for Qwen2-MoE and
// `shared_experts` (DeepSeek-V3 / dots.llm1) otherwise.
// Each entry records its layer and, for routed experts, its expert
// (ParamInfo), and each MoE layer its two expert blocks (expert_blocks()), so
// code that shards or gathers experts needs no tensor names.
// DeepSeek-V4 uses its official names and order instead (docs/deepseek-v4.md,
// "Parameters"); its MTP block j counts as layer L + j in ParamInfo::layer
// and expert_blocks(), so expert parallelism shards the MTP experts too.
class ParamLayout {
 public:
  ParamLayout() = default;
  explicit ParamLayout(const ModelConfig& config);  // validates config
  // Only routed experts [expert_first, expert_first + expert_count) of every
  // MoE layer (expert parallelism: the layout of one rank's gradients and
  // optimizer state); the other tensors as above, in the same order.
  ParamLayout(const ModelConfig& config, int64_t expert_first, int64_t expert_count);

  const ModelConfig& config() const { return config_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t numel() const { return numel_; }  // floats in the buffer
  size_t nbytes() const { return static_cast<size_t>(numel_) * sizeof(float); }
  const ParamInfo* find(std::string_view name) const;  // nullptr if absent
  const ParamInfo& at(std::string_view name) const;    // Error naming it if absent
  // Same names, shapes and offsets.
  bool same_as(const ParamLayout& o) const;
  // The routed experts this layout holds: all, or [expert_first(), +expert_count()).
  bool all_experts() const { return expert_count_ < 0; }
  int64_t expert_first() const { return expert_first_; }
  int64_t expert_count() const { return expert_count_; }
  bool holds_expert(int64_t e) const {
    return all_experts() || (e >= expert_first_ && e < expert_first_ + expert_count_);
  }
  // Where MoE layer `layer`'s routed experts lie (Error for a dense layer).
  // DeepSeek-V4: layers [0, L + num_nextn_predict_layers), MTP blocks last.
  const ExpertBlocks& expert_blocks(int64_t layer) const;
  // DeepSeek-V4: the lightning indexers' tensors (attn.indexer.*) stop being
  // frozen, for a trainer that trains them by their loss
  // (TrainerConfig::indexer_loss_coef). Returns how many tensors changed.
  int64_t train_indexers();

 private:
  ParamInfo& add(std::string name, std::vector<int64_t> shape, ParamKind kind, int64_t layer = -1,
                 int64_t expert = -1);
  void add_layer(int64_t i);  // layer i's tensors, in the order above
  // Layer `layer`'s routed experts under `prefix` ("...experts."): every held
  // expert's gate and up tensors interleaved, then every held expert's down.
  void add_experts(int64_t layer, const std::string& prefix, const char* gate, const char* up, const char* down);
  // DeepSeek-V4: the whole model; one block (a main layer or an MTP block's);
  // an mHC site's fn, base and scale (`mix` rows, `scale` scales).
  void add_v4_model();
  void add_v4_block(const std::string& prefix, int64_t layer);
  void add_hc(const std::string& prefix, int64_t layer, int64_t mix, int64_t scale);

  ModelConfig config_;
  std::vector<ParamInfo> params_;
  std::unordered_map<std::string, size_t> index_;
  int64_t numel_ = 0;
  int64_t expert_first_ = 0, expert_count_ = -1;
  std::vector<ExpertBlocks> expert_blocks_;  // (L), V4 (L + MTP blocks); empty ranges for dense layers
};

// A tensor that is absent in this model (e.g. bq without qkv_bias) is an
// empty Tensor: data == nullptr, ndim == 0. Test with `t.data != nullptr`.

// One SwiGLU FFN: y = w_down · (silu(w_gate · x) ⊙ (w_up · x)).
struct MlpParams {
  Tensor w_gate;     // (F, D)
  Tensor w_up;       // (F, D)
  Tensor w_gate_up;  // (2F, D): the same memory as w_gate then w_up
  Tensor w_down;     // (D, F)
};

struct LayerParams {
  bool is_moe = false;
  Tensor attn_norm;  // (D)            input_layernorm
  Tensor wq;         // (H*Dh, D)
  Tensor wk;         // (Hkv*Dh, D)
  Tensor wv;         // (Hkv*Dh, D)
  Tensor wqkv;       // ((H+2*Hkv)*Dh, D): wq, wk, wv rows, the same memory
  Tensor bq;         // (H*Dh)         [qkv_bias]
  Tensor bk;         // (Hkv*Dh)       [qkv_bias]
  Tensor bv;         // (Hkv*Dh)       [qkv_bias]
  Tensor bqkv;       // ((H+2*Hkv)*Dh) [qkv_bias]
  Tensor q_norm;     // (Dh)           [qk_norm]
  Tensor k_norm;     // (Dh)           [qk_norm]
  Tensor wo;         // (D, H*Dh)
  Tensor mlp_norm;   // (D)            post_attention_layernorm

  MlpParams mlp;  // dense layers: F = intermediate_size

  // MoE layers:
  Tensor router;                   // (E, D)       mlp.gate.weight
  Tensor router_bias;              // (E)          e_score_correction_bias [score_correction_bias]
  Tensor experts_gate_up;          // (E, 2Fe, D)  all experts' w_gate_up (the layout's experts only)
  Tensor experts_down;             // (E, D, Fe)   all experts' w_down (idem)
  std::vector<MlpParams> experts;  // E views into the two above; empty for experts the layout lacks
  MlpParams shared;                // Fs = shared_expert_intermediate_size [n_shared_experts > 0]
  Tensor shared_gate;              // (1, D)       shared_expert_gate.weight [shared_expert_gate]

  // DeepSeek-V4 (docs/deepseek-v4.md). attn_norm, mlp_norm (ffn_norm), router,
  // router_bias (ffn.gate.bias), experts (w1 = gate, w3 = up, w2 = down) and
  // shared (shared_experts) above are reused; wq, wk, wv, wo are empty.
  Tensor hc_attn_fn, hc_attn_base, hc_attn_scale;  // (M, n*D) (M) (3), M = 2n + n*n
  Tensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;     // idem
  Tensor wq_a;        // (Rq, D)        attn.wq_a.weight
  Tensor q_a_norm;    // (Rq)           attn.q_norm.weight
  Tensor wq_b;        // (H*Dh, Rq)     attn.wq_b.weight
  Tensor wkv;         // (Dh, D)        attn.wkv.weight (the one K = V head)
  Tensor kv_norm;     // (Dh)           attn.kv_norm.weight
  Tensor wo_a;        // (G*Ro, H*Dh/G) attn.wo_a.weight (group g: rows [g*Ro, (g+1)*Ro))
  Tensor wo_b;        // (D, G*Ro)      attn.wo_b.weight
  Tensor attn_sink;   // (H)            attn.attn_sink
  // Compressed layers (ratio c > 0; kappa = 2 if c == 4 else 1):
  Tensor cmp_wkv;     // (kappa*Dh, D)  attn.compressor.wkv.weight
  Tensor cmp_wgate;   // (kappa*Dh, D)  attn.compressor.wgate.weight
  Tensor cmp_ape;     // (c, kappa*Dh)  attn.compressor.ape
  Tensor cmp_norm;    // (Dh)           attn.compressor.norm.weight
  // CSA layers (c == 4): the lightning indexer.
  Tensor idx_wq_b;       // (HI*DI, Rq) attn.indexer.wq_b.weight
  Tensor idx_wproj;      // (HI, D)     attn.indexer.weights_proj.weight
  Tensor idx_cmp_wkv;    // (2*DI, D)   attn.indexer.compressor.wkv.weight
  Tensor idx_cmp_wgate;  // (2*DI, D)   attn.indexer.compressor.wgate.weight
  Tensor idx_cmp_ape;    // (4, 2*DI)   attn.indexer.compressor.ape
  Tensor idx_cmp_norm;   // (DI)        attn.indexer.compressor.norm.weight
  Tensor tid2eid;        // (V, K) i32  ffn.gate.tid2eid [hash layers]
};

// DeepSeek-V4's multi-token-prediction block j (tensors under "mtp.j.").
struct MtpParams {
  Tensor e_proj, h_proj;    // (D, D)
  Tensor enorm, hnorm;      // (D)
  LayerParams block;        // a window-only (ratio 0), non-hash MoE block
  Tensor norm;              // (D)
  Tensor hc_head_fn, hc_head_base, hc_head_scale;  // (n, n*D) (n) (1)
};

struct ModelParams {
  Tensor embed;  // (V, D)
  std::vector<LayerParams> layers;
  Tensor final_norm;  // (D)
  Tensor lm_head;     // (V, D); the same view as embed when tie_word_embeddings
  // DeepSeek-V4: the head mix before final_norm, and the MTP blocks.
  Tensor hc_head_fn, hc_head_base, hc_head_scale;  // (n, n*D) (n) (1)
  std::vector<MtpParams> mtp;
};

// Two parameters adjacent in a flat buffer (a's last element right before
// b's first, same width) as one (rows_a + rows_b, cols) matrix: DeepSeek-V4's
// compressors pack and differentiate [wkv; wgate] as one projection. Error if
// they are not adjacent.
Tensor stacked_rows(const Tensor& a, const Tensor& b);

// Views over base[0, layout.numel()). base should be 64-byte aligned (Buffer is).
ModelParams bind(const ParamLayout& layout, float* base);

// A zero-filled, 64-byte-aligned buffer of layout.nbytes().
Buffer alloc_params(const ParamLayout& layout);

// Deterministic init: Matrix ~ normal(0, stddev), Norm = 1, Bias = 0.
// Element j of tensor `name` is Philox(seed).normal(stream = hash(name),
// counter = j): a pure function of (seed, name, j), so the result does not
// depend on the thread count or on which other tensors exist. ctx may be null.
// Index (a (V, K) table over E = num_experts): row v holds the K experts with
// the smallest Philox(seed).u64(hash(name), v*E + e), ties to the lower e,
// smallest first, as int32 bit patterns: K distinct experts, a pure function
// of (seed, name, v).
void init_params(const ParamLayout& layout, float* base, uint64_t seed, float stddev = 0.02f,
                 const Context* ctx = nullptr);

}  // namespace lockstep
