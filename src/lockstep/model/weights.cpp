// Packing of every projection of the model for the GEMM kernels.
#include "lockstep/model/weights.h"

#include <algorithm>
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::model {

namespace {
using Pack = ModelWeights::Pack;

// Appends the range of how.base that the 2-D view w covers (rows may be strided).
void note_source(const Pack& how, const Tensor& w) {
  if (how.sources == nullptr) return;
  LS_CHECK(w.ndim == 2) << "ModelWeights: a projection of " << w.ndim << " dimensions";
  const int64_t first = static_cast<const float*>(w.data) - how.base;
  how.sources->push_back({first, (w.shape[0] - 1) * w.stride[0] + w.shape[1]});
}

// rows: the first rows of w's constituent Hugging Face tensors (fp8 scale
// blocks restart at each, as that tensor's own checkpoint blocks); {} for one.
void pack_into(const Context& ctx, kernels::PackedWeight& pw, const Tensor& w, DType storage, int64_t block,
               Pack how, std::vector<int64_t> rows = {}) {
  note_source(how, w);
  if (how.in_place && storage == DType::F32) {  // the kernels read the master's rows
    pw = kernels::in_place_weight(w);
    return;
  }
  if (how.fresh || pw.storage != storage) {
    pw = kernels::pack_weight(ctx, w, storage, block, std::move(rows));
  } else {
    kernels::repack_weight(ctx, pw, w);
  }
}

// A routed expert's projection: as MXFP4 values when `mxfp4`, else as pack_into.
void pack_expert_into(const Context& ctx, kernels::PackedWeight& pw, const Tensor& w, bool mxfp4,
                      DType storage, int64_t block, Pack how, std::vector<int64_t> rows = {}) {
  if (!mxfp4) {
    pack_into(ctx, pw, w, storage, block, how, std::move(rows));
    return;
  }
  note_source(how, w);
  if (how.fresh || !pw.mxfp4) {
    pw = kernels::pack_weight_mxfp4(ctx, w);
  } else {
    kernels::repack_weight(ctx, pw, w);
  }
}

// q | k | v rows of wqkv; gate | up rows of a w_gate_up.
std::vector<int64_t> qkv_rows(const LayerParams& p) {
  return {0, p.wq.shape[0], p.wq.shape[0] + p.wk.shape[0]};
}
std::vector<int64_t> gate_up_rows(const MlpParams& m) {
  return {0, m.w_gate.shape[0]};
}

// Group g of wo_a (G*Ro, H*Dh/G): rows [g*Ro, (g+1)*Ro).
Tensor wo_a_group(const ModelConfig& c, const Tensor& wo_a, int64_t g) {
  return wo_a.slice_rows(g * c.o_lora_rank, (g + 1) * c.o_lora_rank);
}
}  // namespace

ModelWeights::ModelWeights(const Context& ctx, const ParamLayout& layout, float* params, DType storage,
                           int64_t fp8_block, ExpertShard experts, bool effective, bool in_place)
    : layout_(&layout),
      flat_(params),
      params_(bind(layout, params)),
      storage_(storage),
      fp8_block_(fp8_block),
      experts_(experts) {
  const int64_t E = layout.config().num_experts;
  LS_CHECK(experts.all() || (experts.first >= 0 && experts.count >= 1 && experts.first + experts.count <= E))
      << "expert shard [" << experts.first << ", " << experts.first + experts.count << ") of " << E
      << " experts";
  const Allocator& memory = kernels::device_memory(ctx);
  if (!memory.holds(params)) {  // host parameters for a device: the kernels read a copy
    source_ = params;
    mirror_ = Buffer(layout.nbytes(), memory, Fill::Zero, "model weights");
    flat_ = mirror_.as<float>();
    params_ = bind(layout, flat_);
    memory.copy_in(flat_, source_, layout.nbytes());
  }
  in_place_ = in_place && storage == DType::F32 && ctx.gpu == nullptr && source_ == nullptr;
  layers_.resize(params_.layers.size());
  if (effective && storage != DType::F32) {
    effective_flat_ = Buffer(layout.nbytes(), memory, Fill::Zero, "effective weights");
    effective_ = bind(layout, effective_flat_.as<float>());
  }
  pack_all(ctx, params_, Pack{true, in_place_});
  make_tables(ctx);
}

ModelWeights::ModelWeights(const Context& ctx, const ParamLayout& layout, SnapshotOf source, DType storage,
                           int64_t fp8_block)
    : layout_(&layout),
      source_(source.params),
      snapshot_(true),
      source_params_(bind(layout, const_cast<float*>(source.params))),
      storage_(storage),
      fp8_block_(fp8_block),
      version_(source.version) {
  LS_CHECK(ctx.gpu == nullptr) << "ModelWeights: a snapshot is on the CPU only";
  mirror_ = Buffer(layout.nbytes(), kernels::device_memory(ctx), Fill::Undefined, "model weights snapshot");
  flat_ = mirror_.as<float>();
  params_ = bind(layout, flat_);
  layers_.resize(params_.layers.size());
  std::vector<ParamRange> packed;
  pack_all(ctx, source_params_, Pack{true, false, source_, &packed});
  find_unpacked(std::move(packed));
  copy_unpacked();
  make_tables(ctx);
}

// unpacked_ = [0, numel) less the union of `packed`.
void ModelWeights::find_unpacked(std::vector<ParamRange> packed) {
  std::sort(packed.begin(), packed.end(),
            [](const ParamRange& a, const ParamRange& b) { return a.offset < b.offset; });
  unpacked_.clear();
  int64_t at = 0;
  for (const ParamRange& r : packed) {
    if (r.offset > at) unpacked_.push_back({at, r.offset - at});
    at = std::max(at, r.offset + r.numel);
  }
  if (layout_->numel() > at) unpacked_.push_back({at, layout_->numel() - at});
}

void ModelWeights::copy_unpacked() {
  for (const ParamRange& r : unpacked_)
    std::memcpy(flat_ + r.offset, source_ + r.offset, size_t(r.numel) * sizeof(float));
}

size_t ModelWeights::snapshot_bytes() const {
  size_t n = 0;
  for (const ParamRange& r : unpacked_) n += size_t(r.numel) * sizeof(float);
  return n;
}

void ModelWeights::make_tables(const Context& ctx) {
  const ModelConfig& c = layout_->config();
  const Allocator& memory = kernels::device_memory(ctx);
  if (!c.is_v4()) {
    rope_ = kernels::make_rope_table(ctx, c.head_dim, c.rope_theta, c.max_position_embeddings);
    return;
  }
  const int64_t Dr = c.qk_rope_head_dim;
  rope_ = kernels::make_rope_table(ctx, Dr, c.rope_theta, c.max_position_embeddings, kernels::YarnConfig{});
  kernels::YarnConfig yarn;
  if (c.rope_scaling.type == "yarn")
    yarn = {c.rope_scaling.factor, c.rope_scaling.original_max_position_embeddings, c.rope_scaling.beta_fast,
            c.rope_scaling.beta_slow};
  rope_compressed_ =
      kernels::make_rope_table(ctx, Dr, c.compress_rope_theta, c.max_position_embeddings, yarn);
  ones_ = OwnedTensor(DType::F32, {c.head_dim}, memory, Fill::Undefined, "ones");
  const std::vector<float> ones(size_t(c.head_dim), 1.0f);
  memory.copy_in(ones_.f32(), ones.data(), ones.size() * sizeof(float));
}

// DeepSeek-V4: the attention projections and experts in the storage
// precision; the compressors, the indexer and the router in f32 (as the
// official code keeps them, and as FP8 trainers keep them for stability).
void ModelWeights::pack_v4_attention(const Context& ctx, const LayerParams& p, PackedLayer& q, Pack how) {
  const ModelConfig& c = config();
  const DType s = storage_, f32 = DType::F32;
  const int64_t b = fp8_block_;
  pack_into(ctx, q.wq_a, p.wq_a, s, b, how);
  pack_into(ctx, q.wq_b, p.wq_b, s, b, how);
  pack_into(ctx, q.wkv, p.wkv, s, b, how);
  q.wo_a.resize(size_t(c.o_groups));
  for (int64_t g = 0; g < c.o_groups; ++g)
    pack_into(ctx, q.wo_a[size_t(g)], wo_a_group(c, p.wo_a, g), s, b, how);
  pack_into(ctx, q.wo_b, p.wo_b, s, b, how);
  if (p.cmp_wkv.data != nullptr) pack_into(ctx, q.cmp, stacked_rows(p.cmp_wkv, p.cmp_wgate), f32, 0, how);
  if (p.idx_wq_b.data != nullptr) {
    pack_into(ctx, q.idx_wq_b, p.idx_wq_b, f32, 0, how);
    pack_into(ctx, q.idx_wproj, p.idx_wproj, f32, 0, how);
    pack_into(ctx, q.idx_cmp, stacked_rows(p.idx_cmp_wkv, p.idx_cmp_wgate), f32, 0, how);
  }
}

void ModelWeights::unpack_v4_attention(const Context& ctx, const PackedLayer& q, LayerParams& e) {
  const ModelConfig& c = config();
  kernels::unpack_weight(ctx, e.wq_a, q.wq_a);
  kernels::unpack_weight(ctx, e.wq_b, q.wq_b);
  kernels::unpack_weight(ctx, e.wkv, q.wkv);
  for (int64_t g = 0; g < c.o_groups; ++g)
    kernels::unpack_weight(ctx, wo_a_group(c, e.wo_a, g), q.wo_a[size_t(g)]);
  kernels::unpack_weight(ctx, e.wo_b, q.wo_b);
}

void ModelWeights::refresh(const Context& ctx, uint64_t version) {
  if (snapshot_) {
    copy_unpacked();
    pack_all(ctx, source_params_, Pack{false, false});
  } else {
    if (source_ != nullptr) mirror_.memory().copy_in(flat_, source_, layout_->nbytes());
    pack_all(ctx, params_, Pack{false, in_place_});
  }
  version_ = version;
}

void ModelWeights::pack_layer(const Context& ctx, const LayerParams& p, PackedLayer& q, Pack how) {
  const DType s = storage_;
  const int64_t b = fp8_block_;
  if (config().is_v4()) {
    pack_v4_attention(ctx, p, q, how);
  } else {
    pack_into(ctx, q.wqkv, p.wqkv, s, b, how, qkv_rows(p));
    pack_into(ctx, q.wo, p.wo, s, b, how);
  }
  if (!p.is_moe) {
    pack_into(ctx, q.mlp.gate_up, p.mlp.w_gate_up, s, b, how, gate_up_rows(p.mlp));
    pack_into(ctx, q.mlp.down, p.mlp.w_down, s, b, how);
    return;
  }
  pack_into(ctx, q.router, p.router, DType::F32, 0, how);
  q.experts.resize(p.experts.size());
  const bool fp4 = experts_mxfp4();
  for (size_t e = 0; e < p.experts.size(); ++e) {
    if (!experts_.contains(int64_t(e))) continue;
    pack_expert_into(ctx, q.experts[e].gate_up, p.experts[e].w_gate_up, fp4, s, b, how,
                     gate_up_rows(p.experts[e]));
    pack_expert_into(ctx, q.experts[e].down, p.experts[e].w_down, fp4, s, b, how);
  }
  if (p.shared.w_gate_up.data != nullptr) {
    pack_into(ctx, q.shared.gate_up, p.shared.w_gate_up, s, b, how, gate_up_rows(p.shared));
    pack_into(ctx, q.shared.down, p.shared.w_down, s, b, how);
  }
  if (p.shared_gate.data != nullptr) pack_into(ctx, q.shared_gate, p.shared_gate, DType::F32, 0, how);
}

void ModelWeights::pack_all(const Context& ctx, const ModelParams& from, Pack how) {
  for (size_t i = 0; i < from.layers.size(); ++i) pack_layer(ctx, from.layers[i], layers_[i], how);
  // DeepSeek-V4's MTP blocks (layers L + j) and their input projections.
  mtp_.resize(from.mtp.size());
  for (size_t j = 0; j < from.mtp.size(); ++j) {
    const MtpParams& p = from.mtp[j];
    pack_layer(ctx, p.block, mtp_[j].block, how);
    pack_into(ctx, mtp_[j].e_proj, p.e_proj, storage_, fp8_block_, how);
    pack_into(ctx, mtp_[j].h_proj, p.h_proj, storage_, fp8_block_, how);
  }
  // DeepSeek-V4 holds its output head in f32 (the official code does). A
  // tied head is the embedding, which the forward also reads unpacked.
  Pack head = how;
  if (from.lm_head.data == from.embed.data) head.sources = nullptr;
  pack_into(ctx, lm_head_, from.lm_head, config().is_v4() ? DType::F32 : storage_, fp8_block_, head);
  if (effective_flat_.size()) unpack_effective(ctx);
}

// effective_ = the master, with every packed projection replaced by the
// values its kernels multiply by. The router and shared-expert gate stay f32
// like their packing, so copying the master covers them.
void ModelWeights::unpack_layer(const Context& ctx, const PackedLayer& q, LayerParams& e) {
  if (config().is_v4()) {
    unpack_v4_attention(ctx, q, e);
  } else {
    kernels::unpack_weight(ctx, e.wqkv, q.wqkv);
    kernels::unpack_weight(ctx, e.wo, q.wo);
  }
  if (!e.is_moe) {
    kernels::unpack_weight(ctx, e.mlp.w_gate_up, q.mlp.gate_up);
    kernels::unpack_weight(ctx, e.mlp.w_down, q.mlp.down);
    return;
  }
  for (size_t x = 0; x < q.experts.size(); ++x) {
    if (!experts_.contains(int64_t(x))) continue;
    kernels::unpack_weight(ctx, e.experts[x].w_gate_up, q.experts[x].gate_up);
    kernels::unpack_weight(ctx, e.experts[x].w_down, q.experts[x].down);
  }
  if (e.shared.w_gate_up.data != nullptr) {
    kernels::unpack_weight(ctx, e.shared.w_gate_up, q.shared.gate_up);
    kernels::unpack_weight(ctx, e.shared.w_down, q.shared.down);
  }
}

void ModelWeights::unpack_effective(const Context& ctx) {
  effective_flat_.memory().copy(effective_flat_.data(), flat_, layout_->nbytes());  // both device memory
  for (size_t i = 0; i < params_.layers.size(); ++i) unpack_layer(ctx, layers_[i], effective_.layers[i]);
  for (size_t j = 0; j < mtp_.size(); ++j) {
    unpack_layer(ctx, mtp_[j].block, effective_.mtp[j].block);
    kernels::unpack_weight(ctx, effective_.mtp[j].e_proj, mtp_[j].e_proj);
    kernels::unpack_weight(ctx, effective_.mtp[j].h_proj, mtp_[j].h_proj);
  }
  kernels::unpack_weight(ctx, effective_.lm_head, lm_head_);
}

}  // namespace lockstep::model
