// ModelWeights: the weights a forward pass reads. Norms, biases and the
// embedding are views of the f32 master parameters; every projection is
// packed for the GEMM kernels in a storage precision: f32, bf16 or fp8. Both
// engines pack the same f32 master with the same precision, so they read the
// same packed bits (aligned at every precision); a rollout packed in another
// precision than the trainer's is fast mode. The router always stays f32
// (docs/architecture.md section 4).
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/rope.h"
#include "lockstep/model/expert_parallel.h"
#include "lockstep/model/lora.h"
#include "lockstep/model/params.h"

namespace lockstep::model {

struct PackedMlp {
  kernels::PackedWeight gate_up;  // (2F, D)
  kernels::PackedWeight down;     // (D, F)
};

struct PackedLayer {
  kernels::PackedWeight wqkv;      // ((H+2Hkv)*Dh, D)
  kernels::PackedWeight wo;        // (D, H*Dh)
  PackedMlp mlp;                   // dense layers
  kernels::PackedWeight router;    // (E, D), always f32
  std::vector<PackedMlp> experts;  // (E); empty outside ModelWeights::experts()
  PackedMlp shared;
  kernels::PackedWeight shared_gate;  // (1, D)

  // DeepSeek-V4 (params.h names). The compressors' [wkv; wgate] are packed as
  // one (2*kappa*Dc, D) matrix (adjacent in the layout).
  kernels::PackedWeight wq_a, wq_b, wkv, wo_b;
  std::vector<kernels::PackedWeight> wo_a;             // (G) one (Ro, H*Dh/G) block each
  kernels::PackedWeight cmp;                           // (2*kappa*Dh, D), f32 always
  kernels::PackedWeight idx_wq_b, idx_wproj, idx_cmp;  // CSA layers; f32 always
};

// A DeepSeek-V4 MTP block's packed weights.
struct PackedMtp {
  PackedLayer block;
  kernels::PackedWeight e_proj, h_proj;  // (D, D)
};

class ModelWeights {
 public:
  // `params` must outlive this object; it is the f32 master copy (flat buffer).
  // When it is not in the device memory of ctx (kernels::device_memory), the
  // weights keep a copy there, updated by refresh(): the kernels read that.
  // storage: F32, BF16 or FP8E4M3 (fp8_block as in pack_weight). The fused
  // wqkv and gate|up matrices take their fp8 scale blocks per constituent
  // Hugging Face tensor (q, k, v; gate, up), so the packed bytes and scales are
  // those of an FP8 checkpoint of the master (hf_quant.h fp8_block_quantize).
  // DeepSeek-V4 with expert_dtype = "fp4" at FP8E4M3 storage packs its routed
  // experts as MXFP4 values (kernels::pack_weight_mxfp4), as its official
  // checkpoint keeps them; the other projections take the fp8 blocks.
  // experts: the routed experts to pack (expert parallelism packs only this
  // rank's shard; the others stay empty and a forward must send their rows
  // to their owners, expert_parallel.h).
  // effective: also keep, for backward, an f32 copy of the parameters whose
  // projections hold exactly the values the kernels multiply by (the packed
  // weights widened). In bf16 or fp8 that is the straight-through estimator:
  // activation gradients go through the quantized weights the forward used,
  // weight gradients land on the f32 master. Only a trainer needs it.
  // in_place: at F32 storage on the CPU, the projections are not packed; the
  // kernels read them from the master where they are (kernels::in_place_weight),
  // staging panels per product: 4 bytes per parameter less and the same bits,
  // for a trainer whose products have many rows and that no rollout reads.
  // Ignored at BF16/FP8 (the packed bytes are the quantized weights) and for a
  // device context.
  ModelWeights(const Context& ctx, const ParamLayout& layout, float* params, DType storage = DType::F32,
               int64_t fp8_block = 0, ExpertShard experts = {}, bool effective = false,
               bool in_place = false);

  // A snapshot of `params` on the CPU, for an engine that goes on reading one
  // version while the owner of `params` writes the next (a rollout one step
  // ahead of training): the projections are packed from `params`, and the
  // tensors the kernels read unpacked (embedding, norms, biases, ...) are
  // copied into a buffer of the weights' own. That buffer spans the layout so
  // the views keep their offsets, but only those ranges are ever written: the
  // pages under the packed projections are never touched and take no memory.
  // refresh() re-reads `params`, which must outlive this object; nothing
  // else reads it. `version` is the version of what `params` holds now (the
  // constructor packs it: no refresh is needed before the first use).
  struct SnapshotOf {
    const float* params;
    uint64_t version = 0;
  };
  ModelWeights(const Context& ctx, const ParamLayout& layout, SnapshotOf source, DType storage = DType::F32,
               int64_t fp8_block = 0);

  // How pack_all treats each projection: packed afresh or repacked after an
  // update; in_place binds f32 ones to the master's rows instead.
  struct Pack {
    bool fresh = true;
    bool in_place = false;
    // When set, each projection packed appends the range of `base` it read.
    const float* base = nullptr;
    std::vector<ParamRange>* sources = nullptr;
  };

  // Repacks every projection from the master copy (after an optimizer step or
  // a weight load; copying it to the device first when it is on the host, or
  // re-reading a snapshot's source) and sets the version.
  void refresh(const Context& ctx, uint64_t version);

  const ModelConfig& config() const { return layout_->config(); }
  const ParamLayout& layout() const { return *layout_; }
  const ModelParams& params() const { return params_; }
  // The weights backward multiplies activation gradients by: params() in f32,
  // the widened packed projections in bf16/fp8 (constructed with effective).
  const ModelParams& backward_params() const { return effective_flat_.size() ? effective_ : params_; }
  const float* flat() const { return flat_; }
  // Layer i; for DeepSeek-V4, i = L + j is MTP block j's block.
  const PackedLayer& layer(int64_t i) const {
    const size_t n = layers_.size();
    return size_t(i) < n ? layers_[static_cast<size_t>(i)] : mtp_[size_t(i) - n].block;
  }
  const PackedMtp& mtp(int64_t j) const { return mtp_[static_cast<size_t>(j)]; }
  const kernels::PackedWeight& lm_head() const { return lm_head_; }
  const kernels::RopeTable& rope() const { return rope_; }
  // DeepSeek-V4: the interleaved rope_dim-wide tables of layers with ratio 0
  // (rope(): rope_theta) and of compressed layers (compress_rope_theta + YaRN).
  const kernels::RopeTable& rope_compressed() const { return rope_compressed_; }
  const kernels::RopeTable& rope_of_layer(int64_t layer) const {
    return config().compress_ratio(layer) > 0 ? rope_compressed_ : rope_;
  }
  // DeepSeek-V4: (Dh) ones, the weight of the unweighted per-head query RMS.
  const Tensor& ones() const { return ones_.view(); }
  DType storage() const { return storage_; }
  // Routed experts hold MXFP4 values (fp8 storage of an expert_dtype = "fp4" model).
  bool experts_mxfp4() const { return storage_ == DType::FP8E4M3 && config().expert_dtype == "fp4"; }
  int64_t fp8_block() const { return fp8_block_; }
  const ExpertShard& experts() const { return experts_; }
  uint64_t version() const { return version_; }
  // The projections are read from the master in place (the in_place option took).
  bool in_place() const { return in_place_; }
  // A snapshot: the bytes of the tensors it copies (its own resident master);
  // otherwise 0.
  size_t snapshot_bytes() const;
  // LoRA adapters every forward and backward on these weights applies (null:
  // none). Not owned; they must outlive every forward that reads them. The
  // rollout engine and the trainer attach the same adapters, so both run the
  // same products (docs/kernels.md, "LoRA").
  void set_lora(const LoraWeights* lora) { lora_ = lora; }
  // The version, without repacking: after a step that changed only the
  // attached adapters (which the kernels read where they are).
  void set_version(uint64_t version) { version_ = version; }
  const LoraWeights* lora() const { return lora_; }

 private:
  // Packs every projection of `from` (params_, or a snapshot's source).
  void pack_all(const Context& ctx, const ModelParams& from, Pack how);
  // A snapshot: copies the ranges outside `packed` from source_ (once, to
  // find them) and at each refresh.
  void find_unpacked(std::vector<ParamRange> packed);
  void copy_unpacked();
  // The common tail of both constructors: the rope tables (and V4's ones).
  void make_tables(const Context& ctx);
  void unpack_effective(const Context& ctx);

  const ParamLayout* layout_;
  float* flat_;                    // the master the kernels read: params, or mirror_
  const float* source_ = nullptr;  // the host master mirror_ copies (null: no mirror)
  Buffer mirror_;
  ModelParams params_;
  bool snapshot_ = false;
  ModelParams source_params_;         // a snapshot: the views over source_ it packs
  std::vector<ParamRange> unpacked_;  // a snapshot: the ranges mirror_ holds
  DType storage_;
  int64_t fp8_block_;
  bool in_place_ = false;
  ExpertShard experts_;
  std::vector<PackedLayer> layers_;
  std::vector<PackedMtp> mtp_;  // DeepSeek-V4
  kernels::PackedWeight lm_head_;
  void pack_layer(const Context& ctx, const LayerParams& p, PackedLayer& q, Pack how);
  void unpack_layer(const Context& ctx, const PackedLayer& q, LayerParams& e);
  void pack_v4_attention(const Context& ctx, const LayerParams& p, PackedLayer& q, Pack how);
  void unpack_v4_attention(const Context& ctx, const PackedLayer& q, LayerParams& e);

  kernels::RopeTable rope_;  // cos/sin for positions [0, max_position_embeddings)
  kernels::RopeTable rope_compressed_;
  OwnedTensor ones_;
  Buffer effective_flat_;  // (layout numel) f32; empty unless effective and storage != F32
  ModelParams effective_;  // views into effective_flat_
  uint64_t version_ = 0;
  const LoraWeights* lora_ = nullptr;
};

}  // namespace lockstep::model
