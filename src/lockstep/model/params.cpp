// ParamLayout construction (Hugging Face names in flat-buffer order), typed
// views over a flat buffer, and the deterministic initializer.
#include "lockstep/model/params.h"

#include <algorithm>

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"

namespace lockstep {

namespace {

std::string layer_prefix(int64_t i) {
  return "model.layers." + std::to_string(i) + ".";
}

std::string shared_prefix(const ModelConfig& c, int64_t i) {
  // Qwen2-MoE has one `shared_expert`; DeepSeek-V3 / dots.llm1 fuse theirs into `shared_experts`.
  return layer_prefix(i) +
         (c.architecture == Architecture::Qwen2Moe ? "mlp.shared_expert." : "mlp.shared_experts.");
}

std::string expert_prefix(int64_t i, int64_t e) {
  return layer_prefix(i) + "mlp.experts." + std::to_string(e) + ".";
}

// FNV-1a: a stable 64-bit stream id per tensor name.
uint64_t name_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

void ParamLayout::add(std::string name, std::vector<int64_t> shape, ParamKind kind, int64_t layer, int64_t expert) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  LS_CHECK(index_.count(name) == 0) << "duplicate parameter " << name;
  index_.emplace(name, params_.size());
  params_.push_back(ParamInfo{std::move(name), std::move(shape), numel_, n, kind, layer, expert});
  numel_ += n;
}

ParamLayout::ParamLayout(const ModelConfig& c) : ParamLayout(c, 0, -1) {}

ParamLayout::ParamLayout(const ModelConfig& c, int64_t expert_first, int64_t expert_count)
    : config_(c), expert_first_(expert_first), expert_count_(expert_count) {
  c.validate();
  LS_CHECK(expert_count < 0 || (expert_first >= 0 && expert_count >= 1 && expert_first + expert_count <= c.num_experts))
      << "experts [" << expert_first << ", " << expert_first + expert_count << ") of a model with " << c.num_experts;
  const int64_t V = c.vocab_size, D = c.hidden_size;
  add("model.embed_tokens.weight", {V, D}, ParamKind::Matrix);
  expert_blocks_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) add_layer(i);
  add("model.norm.weight", {D}, ParamKind::Norm);
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, D}, ParamKind::Matrix);
}

void ParamLayout::add_layer(int64_t i) {
  const ModelConfig& c = config_;
  const int64_t D = c.hidden_size, Dh = c.head_dim, Q = c.q_dim(), KV = c.kv_dim();
  const std::string p = layer_prefix(i);
  auto layer_add = [&](const std::string& name, std::vector<int64_t> shape, ParamKind kind) {
    add(name, std::move(shape), kind, i);
  };
  layer_add(p + "input_layernorm.weight", {D}, ParamKind::Norm);
  layer_add(p + "self_attn.q_proj.weight", {Q, D}, ParamKind::Matrix);
  layer_add(p + "self_attn.k_proj.weight", {KV, D}, ParamKind::Matrix);
  layer_add(p + "self_attn.v_proj.weight", {KV, D}, ParamKind::Matrix);
  if (c.qkv_bias) {
    layer_add(p + "self_attn.q_proj.bias", {Q}, ParamKind::Bias);
    layer_add(p + "self_attn.k_proj.bias", {KV}, ParamKind::Bias);
    layer_add(p + "self_attn.v_proj.bias", {KV}, ParamKind::Bias);
  }
  if (c.qk_norm) {
    layer_add(p + "self_attn.q_norm.weight", {Dh}, ParamKind::Norm);
    layer_add(p + "self_attn.k_norm.weight", {Dh}, ParamKind::Norm);
  }
  layer_add(p + "self_attn.o_proj.weight", {D, Q}, ParamKind::Matrix);
  layer_add(p + "post_attention_layernorm.weight", {D}, ParamKind::Norm);
  if (!c.is_moe_layer(i)) {
    const int64_t F = c.intermediate_size;
    layer_add(p + "mlp.gate_proj.weight", {F, D}, ParamKind::Matrix);
    layer_add(p + "mlp.up_proj.weight", {F, D}, ParamKind::Matrix);
    layer_add(p + "mlp.down_proj.weight", {D, F}, ParamKind::Matrix);
    return;
  }
  const int64_t E = c.num_experts, Fe = c.moe_intermediate_size;
  layer_add(p + "mlp.gate.weight", {E, D}, ParamKind::Matrix);
  if (c.score_correction_bias) layer_add(p + "mlp.gate.e_score_correction_bias", {E}, ParamKind::Bias);
  ExpertBlocks& blocks = expert_blocks_[static_cast<size_t>(i)];
  blocks.gate_up.offset = numel_;
  for (int64_t e = 0; e < E; ++e) {
    if (!holds_expert(e)) continue;
    add(expert_prefix(i, e) + "gate_proj.weight", {Fe, D}, ParamKind::Matrix, i, e);
    add(expert_prefix(i, e) + "up_proj.weight", {Fe, D}, ParamKind::Matrix, i, e);
  }
  blocks.gate_up.numel = numel_ - blocks.gate_up.offset;
  blocks.down.offset = numel_;
  for (int64_t e = 0; e < E; ++e)
    if (holds_expert(e)) add(expert_prefix(i, e) + "down_proj.weight", {D, Fe}, ParamKind::Matrix, i, e);
  blocks.down.numel = numel_ - blocks.down.offset;
  if (c.has_shared_expert()) {
    const int64_t Fs = c.shared_expert_intermediate_size;
    const std::string s = shared_prefix(c, i);
    layer_add(s + "gate_proj.weight", {Fs, D}, ParamKind::Matrix);
    layer_add(s + "up_proj.weight", {Fs, D}, ParamKind::Matrix);
    layer_add(s + "down_proj.weight", {D, Fs}, ParamKind::Matrix);
    if (c.shared_expert_gate) layer_add(p + "mlp.shared_expert_gate.weight", {1, D}, ParamKind::Matrix);
  }
}

const ExpertBlocks& ParamLayout::expert_blocks(int64_t layer) const {
  LS_CHECK(layer >= 0 && layer < config_.num_layers && config_.is_moe_layer(layer))
      << "expert_blocks: layer " << layer << " is not a MoE layer of this model";
  return expert_blocks_[static_cast<size_t>(layer)];
}

const ParamInfo* ParamLayout::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &params_[it->second];
}

const ParamInfo& ParamLayout::at(std::string_view name) const {
  const ParamInfo* p = find(name);
  if (!p) LS_THROW << "no parameter named '" << name << "' in this model";
  return *p;
}

bool ParamLayout::same_as(const ParamLayout& o) const {
  if (numel_ != o.numel_ || params_.size() != o.params_.size() || expert_first_ != o.expert_first_ ||
      expert_count_ != o.expert_count_)
    return false;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto &a = params_[i], &b = o.params_[i];
    if (a.name != b.name || a.shape != b.shape || a.offset != b.offset) return false;
  }
  return true;
}

namespace {

class Binder {
 public:
  Binder(const ParamLayout& l, float* base) : l_(l), base_(base) {}

  Tensor view(const std::string& name) const {
    const ParamInfo& p = l_.at(name);
    return Tensor(base_ + p.offset, DType::F32, p.shape);
  }
  Tensor view_if(bool present, const std::string& name) const { return present ? view(name) : Tensor(); }

  // A fused view starting at `first`, checking that the parts really are adjacent.
  Tensor fused(const std::vector<Tensor>& parts, std::vector<int64_t> shape) const {
    const float* next = static_cast<const float*>(parts[0].data);
    for (const Tensor& t : parts) {
      LS_CHECK(t.data == next) << "parameters meant to be adjacent are not";
      next += t.numel();
    }
    return Tensor(parts[0].data, DType::F32, shape);
  }

  MlpParams mlp(const std::string& prefix) const {
    MlpParams m;
    m.w_gate = view(prefix + "gate_proj.weight");
    m.w_up = view(prefix + "up_proj.weight");
    m.w_down = view(prefix + "down_proj.weight");
    m.w_gate_up = fused({m.w_gate, m.w_up}, {2 * m.w_gate.shape[0], m.w_gate.shape[1]});
    return m;
  }

 private:
  const ParamLayout& l_;
  float* base_;
};

}  // namespace

ModelParams bind(const ParamLayout& layout, float* base) {
  LS_CHECK(base != nullptr || layout.numel() == 0) << "bind: null buffer";
  const ModelConfig& c = layout.config();
  Binder b(layout, base);
  ModelParams m;
  m.embed = b.view("model.embed_tokens.weight");
  m.final_norm = b.view("model.norm.weight");
  m.lm_head = c.tie_word_embeddings ? m.embed : b.view("lm_head.weight");
  const int64_t D = c.hidden_size;
  m.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerParams& L = m.layers[static_cast<size_t>(i)];
    const std::string p = layer_prefix(i);
    L.is_moe = c.is_moe_layer(i);
    L.attn_norm = b.view(p + "input_layernorm.weight");
    L.wq = b.view(p + "self_attn.q_proj.weight");
    L.wk = b.view(p + "self_attn.k_proj.weight");
    L.wv = b.view(p + "self_attn.v_proj.weight");
    const int64_t qkv = c.q_dim() + 2 * c.kv_dim();
    L.wqkv = b.fused({L.wq, L.wk, L.wv}, {qkv, D});
    if (c.qkv_bias) {
      L.bq = b.view(p + "self_attn.q_proj.bias");
      L.bk = b.view(p + "self_attn.k_proj.bias");
      L.bv = b.view(p + "self_attn.v_proj.bias");
      L.bqkv = b.fused({L.bq, L.bk, L.bv}, {qkv});
    }
    L.q_norm = b.view_if(c.qk_norm, p + "self_attn.q_norm.weight");
    L.k_norm = b.view_if(c.qk_norm, p + "self_attn.k_norm.weight");
    L.wo = b.view(p + "self_attn.o_proj.weight");
    L.mlp_norm = b.view(p + "post_attention_layernorm.weight");
    if (!L.is_moe) {
      L.mlp = b.mlp(p + "mlp.");
      continue;
    }
    const int64_t E = c.num_experts, Fe = c.moe_intermediate_size;
    L.router = b.view(p + "mlp.gate.weight");
    L.router_bias = b.view_if(c.score_correction_bias, p + "mlp.gate.e_score_correction_bias");
    L.experts.resize(static_cast<size_t>(E));
    std::vector<Tensor> gate_up_parts, down_parts;
    for (int64_t e = 0; e < E; ++e) {
      if (!layout.holds_expert(e)) continue;
      L.experts[size_t(e)] = b.mlp(expert_prefix(i, e));
      gate_up_parts.push_back(L.experts[size_t(e)].w_gate_up);
      down_parts.push_back(L.experts[size_t(e)].w_down);
    }
    const int64_t held = int64_t(gate_up_parts.size());
    L.experts_gate_up = b.fused(gate_up_parts, {held, 2 * Fe, D});
    L.experts_down = b.fused(down_parts, {held, D, Fe});
    if (c.has_shared_expert()) L.shared = b.mlp(shared_prefix(c, i));
    L.shared_gate = b.view_if(c.shared_expert_gate, p + "mlp.shared_expert_gate.weight");
  }
  return m;
}

Buffer alloc_params(const ParamLayout& layout) {
  return Buffer(layout.nbytes());
}

void init_params(const ParamLayout& layout, float* base, uint64_t seed, float stddev, const Context* ctx) {
  const auto& params = layout.params();
  std::vector<uint64_t> streams(params.size());
  for (size_t i = 0; i < params.size(); ++i) streams[i] = name_hash(params[i].name);
  const Philox rng(seed);
  // Chunks of the flat buffer are independent: every element's value is a
  // function of (seed, tensor name, index), never of the partition.
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t n_chunks = (layout.numel() + kChunk - 1) / kChunk;
  auto fill = [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t begin = ch * kChunk, end = std::min(layout.numel(), begin + kChunk);
      // First tensor that ends after `begin`.
      auto it = std::upper_bound(params.begin(), params.end(), begin,
                                 [](int64_t x, const ParamInfo& p) { return x < p.offset + p.numel; });
      for (; it != params.end() && it->offset < end; ++it) {
        const int64_t lo = std::max(begin, it->offset), hi = std::min(end, it->offset + it->numel);
        float* dst = base + lo;
        switch (it->kind) {
          case ParamKind::Norm: std::fill(dst, dst + (hi - lo), 1.0f); break;
          case ParamKind::Bias: std::fill(dst, dst + (hi - lo), 0.0f); break;
          case ParamKind::Matrix: {
            const uint64_t stream = streams[static_cast<size_t>(it - params.begin())];
            for (int64_t j = lo; j < hi; ++j)
              dst[j - lo] = stddev * rng.normal(stream, static_cast<uint64_t>(j - it->offset));
            break;
          }
        }
      }
    }
  };
  if (ctx)
    ctx->parallel_for(n_chunks, fill);
  else
    fill(0, n_chunks);
}

}  // namespace lockstep
