// ParamLayout construction (Hugging Face names in flat-buffer order; DeepSeek-V4
// with its official names), typed views over a flat buffer, and the
// deterministic initializer.
#include "lockstep/model/params.h"

#include <algorithm>
#include <cstring>

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

std::string experts_prefix(int64_t i) {
  return layer_prefix(i) + "mlp.experts.";
}

// DeepSeek-V4's official names: "layers.i." for a main layer, "mtp.j." for an MTP block.
std::string v4_layer_prefix(int64_t i) {
  return "layers." + std::to_string(i) + ".";
}
std::string v4_mtp_prefix(int64_t j) {
  return "mtp." + std::to_string(j) + ".";
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

ParamInfo& ParamLayout::add(std::string name, std::vector<int64_t> shape, ParamKind kind, int64_t layer,
                            int64_t expert) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  LS_CHECK(index_.count(name) == 0) << "duplicate parameter " << name;
  index_.emplace(name, params_.size());
  params_.push_back(ParamInfo{std::move(name), std::move(shape), numel_, n, kind, layer, expert});
  numel_ += n;
  return params_.back();
}

ParamLayout::ParamLayout(const ModelConfig& c) : ParamLayout(c, 0, -1) {}

ParamLayout::ParamLayout(const ModelConfig& c, int64_t expert_first, int64_t expert_count) : config_(c) {
  expert_first_ = expert_first;
  expert_count_ = expert_count;
  c.validate();
  LS_CHECK(expert_count < 0 || (expert_first >= 0 && expert_count >= 1 && expert_first + expert_count <= c.num_experts))
      << "experts [" << expert_first << ", " << expert_first + expert_count << ") of a model with " << c.num_experts;
  if (c.is_v4()) {
    add_v4_model();
    return;
  }
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
  const int64_t E = c.num_experts;
  layer_add(p + "mlp.gate.weight", {E, D}, ParamKind::Matrix);
  if (c.score_correction_bias) layer_add(p + "mlp.gate.e_score_correction_bias", {E}, ParamKind::Bias);
  add_experts(i, experts_prefix(i), "gate_proj.weight", "up_proj.weight", "down_proj.weight");
  if (c.has_shared_expert()) {
    const int64_t Fs = c.shared_expert_intermediate_size;
    const std::string s = shared_prefix(c, i);
    layer_add(s + "gate_proj.weight", {Fs, D}, ParamKind::Matrix);
    layer_add(s + "up_proj.weight", {Fs, D}, ParamKind::Matrix);
    layer_add(s + "down_proj.weight", {D, Fs}, ParamKind::Matrix);
    if (c.shared_expert_gate) layer_add(p + "mlp.shared_expert_gate.weight", {1, D}, ParamKind::Matrix);
  }
}

void ParamLayout::add_experts(int64_t layer, const std::string& prefix, const char* gate, const char* up,
                              const char* down) {
  const int64_t E = config_.num_experts, Fe = config_.moe_intermediate_size, D = config_.hidden_size;
  auto name = [&](int64_t e, const char* what) { return prefix + std::to_string(e) + "." + what; };
  ExpertBlocks& blocks = expert_blocks_[static_cast<size_t>(layer)];
  blocks.gate_up.offset = numel_;
  for (int64_t e = 0; e < E; ++e) {
    if (!holds_expert(e)) continue;
    add(name(e, gate), {Fe, D}, ParamKind::Matrix, layer, e);
    add(name(e, up), {Fe, D}, ParamKind::Matrix, layer, e);
  }
  blocks.gate_up.numel = numel_ - blocks.gate_up.offset;
  blocks.down.offset = numel_;
  for (int64_t e = 0; e < E; ++e)
    if (holds_expert(e)) add(name(e, down), {D, Fe}, ParamKind::Matrix, layer, e);
  blocks.down.numel = numel_ - blocks.down.offset;
}

// ---- DeepSeek-V4 (docs/deepseek-v4.md, "Parameters") ----

void ParamLayout::add_v4_model() {
  const ModelConfig& c = config_;
  const int64_t V = c.vocab_size, D = c.hidden_size, L = c.num_layers, n = c.hc_mult;
  add("embed.weight", {V, D}, ParamKind::Matrix);
  expert_blocks_.resize(static_cast<size_t>(L + c.num_nextn_predict_layers));
  for (int64_t i = 0; i < L; ++i) add_v4_block(v4_layer_prefix(i), i);
  add("norm.weight", {D}, ParamKind::Norm);
  add_hc("hc_head_", -1, n, 1);
  add("head.weight", {V, D}, ParamKind::Matrix);
  for (int64_t j = 0; j < c.num_nextn_predict_layers; ++j) {
    const std::string p = v4_mtp_prefix(j);
    const int64_t layer = L + j;
    add(p + "e_proj.weight", {D, D}, ParamKind::Matrix, layer);
    add(p + "h_proj.weight", {D, D}, ParamKind::Matrix, layer);
    add(p + "enorm.weight", {D}, ParamKind::Norm, layer);
    add(p + "hnorm.weight", {D}, ParamKind::Norm, layer);
    add_v4_block(p, layer);
    add(p + "norm.weight", {D}, ParamKind::Norm, layer);
    add_hc(p + "hc_head_", layer, n, 1);
  }
}

// fn (mix, n*D), base (mix), scale (scale): the mixing projection, its bias
// and the gains, all kept in f32.
void ParamLayout::add_hc(const std::string& prefix, int64_t layer, int64_t mix, int64_t scale) {
  const int64_t nD = config_.hc_mult * config_.hidden_size;
  add(prefix + "fn", {mix, nD}, ParamKind::Matrix, layer).keep_f32 = true;
  add(prefix + "base", {mix}, ParamKind::Bias, layer).keep_f32 = true;
  add(prefix + "scale", {scale}, ParamKind::Norm, layer).keep_f32 = true;
}

void ParamLayout::add_v4_block(const std::string& p, int64_t layer) {
  const ModelConfig& c = config_;
  const int64_t D = c.hidden_size, Dh = c.head_dim, H = c.num_heads, Rq = c.q_lora_rank, G = c.o_groups,
                Ro = c.o_lora_rank, E = c.num_experts, Fe = c.moe_intermediate_size, M = c.hc_mix_size();
  const int64_t ratio = c.compress_ratio(layer);  // MTP blocks: 0 (validated)
  auto matrix = [&](const std::string& name, std::vector<int64_t> shape) -> ParamInfo& {
    return add(p + name, std::move(shape), ParamKind::Matrix, layer);
  };
  auto norm = [&](const std::string& name, int64_t size) { add(p + name, {size}, ParamKind::Norm, layer); };
  auto f32_bias = [&](const std::string& name, std::vector<int64_t> shape) -> ParamInfo& {
    ParamInfo& info = add(p + name, std::move(shape), ParamKind::Bias, layer);
    info.keep_f32 = true;
    return info;
  };
  add_hc(p + "hc_attn_", layer, M, 3);
  norm("attn_norm.weight", D);
  matrix("attn.wq_a.weight", {Rq, D});
  norm("attn.q_norm.weight", Rq);
  matrix("attn.wkv.weight", {Dh, D});
  norm("attn.kv_norm.weight", Dh);
  matrix("attn.wq_b.weight", {H * Dh, Rq});
  matrix("attn.wo_a.weight", {G * Ro, H * Dh / G});
  matrix("attn.wo_b.weight", {D, G * Ro});
  f32_bias("attn.attn_sink", {H});
  if (ratio > 0) {
    const int64_t kappa = ratio == 4 ? 2 : 1;  // ratio 4 compresses overlapping blocks
    matrix("attn.compressor.wkv.weight", {kappa * Dh, D});
    matrix("attn.compressor.wgate.weight", {kappa * Dh, D});
    f32_bias("attn.compressor.ape", {ratio, kappa * Dh});
    norm("attn.compressor.norm.weight", Dh);
  }
  if (ratio == 4) {
    // The lightning indexer learns only from its own loss: frozen here.
    const size_t first = params_.size();
    const int64_t HI = c.index_n_heads, DI = c.index_head_dim;
    matrix("attn.indexer.wq_b.weight", {HI * DI, Rq});
    matrix("attn.indexer.weights_proj.weight", {HI, D});
    matrix("attn.indexer.compressor.wkv.weight", {2 * DI, D});
    matrix("attn.indexer.compressor.wgate.weight", {2 * DI, D});
    f32_bias("attn.indexer.compressor.ape", {4, 2 * DI});
    norm("attn.indexer.compressor.norm.weight", DI);
    for (size_t k = first; k < params_.size(); ++k) params_[k].frozen = true;
  }
  add_hc(p + "hc_ffn_", layer, M, 3);
  norm("ffn_norm.weight", D);
  matrix("ffn.gate.weight", {E, D});
  if (c.is_hash_layer(layer)) {
    ParamInfo& t = add(p + "ffn.gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}, ParamKind::Index, layer);
    t.frozen = true;
  } else {
    f32_bias("ffn.gate.bias", {E});
  }
  add_experts(layer, p + "ffn.experts.", "w1.weight", "w3.weight", "w2.weight");
  matrix("ffn.shared_experts.w1.weight", {Fe, D});
  matrix("ffn.shared_experts.w3.weight", {Fe, D});
  matrix("ffn.shared_experts.w2.weight", {D, Fe});
}

int64_t ParamLayout::train_indexers() {
  int64_t n = 0;
  for (ParamInfo& p : params_)
    if (p.frozen && p.name.find("attn.indexer.") != std::string::npos) {
      p.frozen = false;
      ++n;
    }
  return n;
}

const ExpertBlocks& ParamLayout::expert_blocks(int64_t layer) const {
  LS_CHECK(layer >= 0 && layer < int64_t(expert_blocks_.size()) && config_.is_moe_layer(layer))
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
    LS_CHECK(p.kind != ParamKind::Index) << name << " is an integer table (view_i32)";
    return Tensor(base_ + p.offset, DType::F32, p.shape);
  }
  Tensor view_if(bool present, const std::string& name) const { return present ? view(name) : Tensor(); }
  // An Index table: int32 bit patterns in the float slots.
  Tensor view_i32(const std::string& name) const {
    const ParamInfo& p = l_.at(name);
    LS_CHECK(p.kind == ParamKind::Index) << name << " is not an integer table";
    return Tensor(base_ + p.offset, DType::I32, p.shape);
  }

  // A fused view starting at `first`, checking that the parts really are adjacent.
  Tensor fused(const std::vector<Tensor>& parts, std::vector<int64_t> shape) const {
    const float* next = static_cast<const float*>(parts[0].data);
    for (const Tensor& t : parts) {
      LS_CHECK(t.data == next) << "parameters meant to be adjacent are not";
      next += t.numel();
    }
    return Tensor(parts[0].data, DType::F32, shape);
  }

  MlpParams mlp(const std::string& prefix, const char* gate = "gate_proj.weight", const char* up = "up_proj.weight",
                const char* down = "down_proj.weight") const {
    MlpParams m;
    m.w_gate = view(prefix + gate);
    m.w_up = view(prefix + up);
    m.w_down = view(prefix + down);
    m.w_gate_up = fused({m.w_gate, m.w_up}, {2 * m.w_gate.shape[0], m.w_gate.shape[1]});
    return m;
  }

  // The layout's routed experts under `prefix` ("...experts."): one MlpParams
  // each (empty for experts the layout lacks) and the two fused blocks.
  void experts(LayerParams& L, const std::string& prefix, const char* gate, const char* up, const char* down) const {
    const ModelConfig& c = l_.config();
    const int64_t E = c.num_experts, Fe = c.moe_intermediate_size, D = c.hidden_size;
    L.experts.resize(static_cast<size_t>(E));
    std::vector<Tensor> gate_up_parts, down_parts;
    for (int64_t e = 0; e < E; ++e) {
      if (!l_.holds_expert(e)) continue;
      MlpParams& x = L.experts[size_t(e)];
      x = mlp(prefix + std::to_string(e) + ".", gate, up, down);
      gate_up_parts.push_back(x.w_gate_up);
      down_parts.push_back(x.w_down);
    }
    const int64_t held = int64_t(gate_up_parts.size());
    L.experts_gate_up = fused(gate_up_parts, {held, 2 * Fe, D});
    L.experts_down = fused(down_parts, {held, D, Fe});
  }

 private:
  const ParamLayout& l_;
  float* base_;
};

// DeepSeek-V4's block under prefix p (a main layer or an MTP block's).
LayerParams bind_v4_block(const ModelConfig& c, const Binder& b, const std::string& p, int64_t layer) {
  const int64_t ratio = c.compress_ratio(layer);
  LayerParams L;
  L.is_moe = true;
  L.hc_attn_fn = b.view(p + "hc_attn_fn");
  L.hc_attn_base = b.view(p + "hc_attn_base");
  L.hc_attn_scale = b.view(p + "hc_attn_scale");
  L.attn_norm = b.view(p + "attn_norm.weight");
  L.wq_a = b.view(p + "attn.wq_a.weight");
  L.q_a_norm = b.view(p + "attn.q_norm.weight");
  L.wkv = b.view(p + "attn.wkv.weight");
  L.kv_norm = b.view(p + "attn.kv_norm.weight");
  L.wq_b = b.view(p + "attn.wq_b.weight");
  L.wo_a = b.view(p + "attn.wo_a.weight");
  L.wo_b = b.view(p + "attn.wo_b.weight");
  L.attn_sink = b.view(p + "attn.attn_sink");
  L.cmp_wkv = b.view_if(ratio > 0, p + "attn.compressor.wkv.weight");
  L.cmp_wgate = b.view_if(ratio > 0, p + "attn.compressor.wgate.weight");
  L.cmp_ape = b.view_if(ratio > 0, p + "attn.compressor.ape");
  L.cmp_norm = b.view_if(ratio > 0, p + "attn.compressor.norm.weight");
  L.idx_wq_b = b.view_if(ratio == 4, p + "attn.indexer.wq_b.weight");
  L.idx_wproj = b.view_if(ratio == 4, p + "attn.indexer.weights_proj.weight");
  L.idx_cmp_wkv = b.view_if(ratio == 4, p + "attn.indexer.compressor.wkv.weight");
  L.idx_cmp_wgate = b.view_if(ratio == 4, p + "attn.indexer.compressor.wgate.weight");
  L.idx_cmp_ape = b.view_if(ratio == 4, p + "attn.indexer.compressor.ape");
  L.idx_cmp_norm = b.view_if(ratio == 4, p + "attn.indexer.compressor.norm.weight");
  L.hc_ffn_fn = b.view(p + "hc_ffn_fn");
  L.hc_ffn_base = b.view(p + "hc_ffn_base");
  L.hc_ffn_scale = b.view(p + "hc_ffn_scale");
  L.mlp_norm = b.view(p + "ffn_norm.weight");
  L.router = b.view(p + "ffn.gate.weight");
  const bool hash = c.is_hash_layer(layer);
  L.router_bias = b.view_if(!hash, p + "ffn.gate.bias");
  if (hash) L.tid2eid = b.view_i32(p + "ffn.gate.tid2eid");
  b.experts(L, p + "ffn.experts.", "w1.weight", "w3.weight", "w2.weight");
  L.shared = b.mlp(p + "ffn.shared_experts.", "w1.weight", "w3.weight", "w2.weight");
  return L;
}

ModelParams bind_v4(const ModelConfig& c, const Binder& b) {
  ModelParams m;
  m.embed = b.view("embed.weight");
  m.final_norm = b.view("norm.weight");
  m.lm_head = b.view("head.weight");
  m.hc_head_fn = b.view("hc_head_fn");
  m.hc_head_base = b.view("hc_head_base");
  m.hc_head_scale = b.view("hc_head_scale");
  for (int64_t i = 0; i < c.num_layers; ++i) m.layers.push_back(bind_v4_block(c, b, v4_layer_prefix(i), i));
  for (int64_t j = 0; j < c.num_nextn_predict_layers; ++j) {
    const std::string p = v4_mtp_prefix(j);
    MtpParams t;
    t.e_proj = b.view(p + "e_proj.weight");
    t.h_proj = b.view(p + "h_proj.weight");
    t.enorm = b.view(p + "enorm.weight");
    t.hnorm = b.view(p + "hnorm.weight");
    t.block = bind_v4_block(c, b, p, c.num_layers + j);
    t.norm = b.view(p + "norm.weight");
    t.hc_head_fn = b.view(p + "hc_head_fn");
    t.hc_head_base = b.view(p + "hc_head_base");
    t.hc_head_scale = b.view(p + "hc_head_scale");
    m.mtp.push_back(std::move(t));
  }
  return m;
}

}  // namespace

ModelParams bind(const ParamLayout& layout, float* base) {
  LS_CHECK(base != nullptr || layout.numel() == 0) << "bind: null buffer";
  const ModelConfig& c = layout.config();
  Binder b(layout, base);
  if (c.is_v4()) return bind_v4(c, b);
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
    L.router = b.view(p + "mlp.gate.weight");
    L.router_bias = b.view_if(c.score_correction_bias, p + "mlp.gate.e_score_correction_bias");
    b.experts(L, experts_prefix(i), "gate_proj.weight", "up_proj.weight", "down_proj.weight");
    if (c.has_shared_expert()) L.shared = b.mlp(shared_prefix(c, i));
    L.shared_gate = b.view_if(c.shared_expert_gate, p + "mlp.shared_expert_gate.weight");
  }
  return m;
}

Tensor stacked_rows(const Tensor& a, const Tensor& b) {
  LS_CHECK(static_cast<const float*>(a.data) + a.numel() == b.data && a.dim(1) == b.dim(1))
      << "stacked_rows: the two parameters are not adjacent rows of one buffer";
  return Tensor(a.data, DType::F32, {a.dim(0) + b.dim(0), a.dim(1)});
}

Buffer alloc_params(const ParamLayout& layout) {
  return Buffer(layout.nbytes());
}

namespace {

// Elements [lo, hi) of an Index table (R, K) over E values: row r holds the
// K values e with the smallest key u64(stream, r*E + e), ties to the lower e,
// smallest key first. A row is computed whole and only its elements inside
// [lo, hi) written, so a chunk boundary through a row changes nothing.
void fill_index_rows(const Philox& rng, uint64_t stream, const ParamInfo& info, int64_t E, int64_t lo, int64_t hi,
                     float* base) {
  const int64_t K = info.shape.back();
  LS_CHECK(info.shape.size() == 2 && K >= 1 && K <= E) << info.name << ": an Index table needs (rows, K <= " << E
                                                       << ") values";
  std::vector<std::pair<uint64_t, int32_t>> keys(static_cast<size_t>(E));
  const int64_t first_row = (lo - info.offset) / K, last_row = (hi - 1 - info.offset) / K;
  for (int64_t r = first_row; r <= last_row; ++r) {
    for (int64_t e = 0; e < E; ++e)
      keys[size_t(e)] = {rng.u64(stream, static_cast<uint64_t>(r * E + e)), static_cast<int32_t>(e)};
    std::partial_sort(keys.begin(), keys.begin() + K, keys.end());
    for (int64_t k = 0; k < K; ++k) {
      const int64_t at = info.offset + r * K + k;
      if (at >= lo && at < hi) std::memcpy(base + at, &keys[size_t(k)].second, sizeof(int32_t));
    }
  }
}

}  // namespace

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
          case ParamKind::Index:
            fill_index_rows(rng, streams[static_cast<size_t>(it - params.begin())], *it,
                            layout.config().num_experts, lo, hi, base);
            break;
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
