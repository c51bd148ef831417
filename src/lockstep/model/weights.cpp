// Packing of every projection of the model for the GEMM kernels.
#include "lockstep/model/weights.h"

#include <cstring>

#include "lockstep/base/error.h"

namespace lockstep::model {

namespace {
void pack_into(const Context& ctx, kernels::PackedWeight& pw, const Tensor& w, DType storage, int64_t block,
               bool fresh) {
  if (fresh || pw.storage != storage) {
    pw = kernels::pack_weight(ctx, w, storage, block);
  } else {
    kernels::repack_weight(ctx, pw, w);
  }
}
}  // namespace

ModelWeights::ModelWeights(const Context& ctx, const ParamLayout& layout, float* params, DType storage,
                           int64_t fp8_block, ExpertShard experts, bool effective)
    : layout_(&layout),
      flat_(params),
      params_(bind(layout, params)),
      storage_(storage),
      fp8_block_(fp8_block),
      experts_(experts) {
  const int64_t E = layout.config().num_experts;
  LS_CHECK(experts.all() || (experts.first >= 0 && experts.count >= 1 && experts.first + experts.count <= E))
      << "expert shard [" << experts.first << ", " << experts.first + experts.count << ") of " << E << " experts";
  layers_.resize(params_.layers.size());
  if (effective && storage != DType::F32) {
    effective_flat_ = Buffer(layout.nbytes());
    effective_ = bind(layout, effective_flat_.as<float>());
  }
  pack_all(ctx, true);
  const ModelConfig& c = layout.config();
  rope_ = kernels::make_rope_table(ctx, c.head_dim, c.rope_theta, c.max_position_embeddings);
}

void ModelWeights::refresh(const Context& ctx, uint64_t version) {
  pack_all(ctx, false);
  version_ = version;
}

void ModelWeights::pack_all(const Context& ctx, bool fresh) {
  const DType s = storage_;
  const int64_t b = fp8_block_;
  for (size_t i = 0; i < params_.layers.size(); ++i) {
    const LayerParams& p = params_.layers[i];
    PackedLayer& q = layers_[i];
    pack_into(ctx, q.wqkv, p.wqkv, s, b, fresh);
    pack_into(ctx, q.wo, p.wo, s, b, fresh);
    if (!p.is_moe) {
      pack_into(ctx, q.mlp.gate_up, p.mlp.w_gate_up, s, b, fresh);
      pack_into(ctx, q.mlp.down, p.mlp.w_down, s, b, fresh);
      continue;
    }
    pack_into(ctx, q.router, p.router, DType::F32, 0, fresh);
    q.experts.resize(p.experts.size());
    for (size_t e = 0; e < p.experts.size(); ++e) {
      if (!experts_.contains(int64_t(e))) continue;
      pack_into(ctx, q.experts[e].gate_up, p.experts[e].w_gate_up, s, b, fresh);
      pack_into(ctx, q.experts[e].down, p.experts[e].w_down, s, b, fresh);
    }
    if (p.shared.w_gate_up.data != nullptr) {
      pack_into(ctx, q.shared.gate_up, p.shared.w_gate_up, s, b, fresh);
      pack_into(ctx, q.shared.down, p.shared.w_down, s, b, fresh);
    }
    if (p.shared_gate.data != nullptr) pack_into(ctx, q.shared_gate, p.shared_gate, DType::F32, 0, fresh);
  }
  pack_into(ctx, lm_head_, params_.lm_head, s, b, fresh);
  if (effective_flat_.size()) unpack_effective(ctx);
}

// effective_ = the master, with every packed projection replaced by the
// values its kernels multiply by. The router and shared-expert gate stay f32
// like their packing, so copying the master covers them.
void ModelWeights::unpack_effective(const Context& ctx) {
  std::memcpy(effective_flat_.data(), flat_, layout_->nbytes());
  for (size_t i = 0; i < params_.layers.size(); ++i) {
    const PackedLayer& q = layers_[i];
    LayerParams& e = effective_.layers[i];
    kernels::unpack_weight(ctx, e.wqkv, q.wqkv);
    kernels::unpack_weight(ctx, e.wo, q.wo);
    if (!params_.layers[i].is_moe) {
      kernels::unpack_weight(ctx, e.mlp.w_gate_up, q.mlp.gate_up);
      kernels::unpack_weight(ctx, e.mlp.w_down, q.mlp.down);
      continue;
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
  kernels::unpack_weight(ctx, effective_.lm_head, lm_head_);
}

}  // namespace lockstep::model
