// DeepSeek-V4's part of ModelConfig: the checks of its fields (and their
// absence from every other architecture) and its config.json keys, read and
// written under the official names (docs/deepseek-v4.md, "Config keys").
#include <algorithm>
#include <cmath>

#include "lockstep/base/excerpt.h"
#include "lockstep/model/config_detail.h"

namespace lockstep::config_detail {

namespace {

// "<source>: invalid <field>: <why>", the format of ModelConfig::validate.
class Refuse {
 public:
  explicit Refuse(const std::string& source) : source_(source) {}
  [[noreturn]] void operator()(const std::string& field, const std::string& why) const {
    LS_THROW << source_ << ": invalid " << field << ": " << why;
  }
  void positive(const char* field, int64_t v) const {
    if (v <= 0) (*this)(field, "must be positive, got " + std::to_string(v));
  }
  void positive_finite(const char* field, double v) const {
    if (!(v > 0.0) || !std::isfinite(v)) (*this)(field, "must be positive and finite");
  }

 private:
  const std::string& source_;
};

bool has_ratio(const ModelConfig& c, int64_t ratio) {
  return std::find(c.compress_ratios.begin(), c.compress_ratios.end(), ratio) != c.compress_ratios.end();
}

// The attention shapes: one shared K = V head, low-rank q and grouped
// low-rank output, RoPE on the last Dr dims, the sliding window.
void validate_v4_attention(const ModelConfig& c, const Refuse& refuse) {
  if (c.num_kv_heads != 1)
    refuse("num_kv_heads",
           "DeepSeek-V4 has one shared K = V head, so it must be 1, got " + std::to_string(c.num_kv_heads));
  refuse.positive("q_lora_rank", c.q_lora_rank);
  refuse.positive("o_groups", c.o_groups);
  refuse.positive("o_lora_rank", c.o_lora_rank);
  if (c.num_heads % c.o_groups != 0)
    refuse("o_groups",
           "must divide num_heads=" + std::to_string(c.num_heads) + ", got " + std::to_string(c.o_groups));
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim >= c.head_dim)
    refuse("qk_rope_head_dim", "must be even and in (0, head_dim=" + std::to_string(c.head_dim) + "), got " +
                                   std::to_string(c.qk_rope_head_dim));
  refuse.positive("sliding_window", c.sliding_window);
}

// Compression ratios, one per layer then one per MTP block; the compressed
// layers' RoPE (YaRN) and the lightning indexer of the ratio-4 layers.
void validate_v4_compression(const ModelConfig& c, const Refuse& refuse) {
  if (c.num_nextn_predict_layers < 0) refuse("num_nextn_predict_layers", "must not be negative");
  if (c.num_nextn_predict_layers > 4096)
    refuse("num_nextn_predict_layers", "is above 4096");  // as num_layers
  const int64_t want = c.num_layers + c.num_nextn_predict_layers;
  if (int64_t(c.compress_ratios.size()) != want)
    refuse("compress_ratios",
           "needs one entry per layer and per MTP block (num_layers + num_nextn_predict_layers = " +
               std::to_string(want) + "), got " + std::to_string(c.compress_ratios.size()));
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    const int64_t r = c.compress_ratios[i];
    if (r != 0 && r != 4 && r != 128)
      refuse("compress_ratios",
             "entry " + std::to_string(i) + " is " + std::to_string(r) + "; must be 0, 4 or 128");
    if (int64_t(i) >= c.num_layers && r != 0)
      refuse("compress_ratios", "entry " + std::to_string(i) +
                                    " is an MTP block, which must have ratio 0, got " + std::to_string(r));
  }
  if (has_ratio(c, 4) || has_ratio(c, 128))
    refuse.positive_finite("compress_rope_theta", c.compress_rope_theta);
  else if (!(c.compress_rope_theta >= 0.0) || !std::isfinite(c.compress_rope_theta))
    refuse("compress_rope_theta", "must be finite and not negative");

  const RopeScaling& y = c.rope_scaling;
  if (y.type == "yarn") {
    if (!(y.factor >= 1.0) || !std::isfinite(y.factor))
      refuse("rope_scaling.factor", "must be finite and >= 1");
    refuse.positive("rope_scaling.original_max_position_embeddings", y.original_max_position_embeddings);
    if (!std::isfinite(y.beta_fast) || !std::isfinite(y.beta_slow) || !(y.beta_fast > y.beta_slow) ||
        !(y.beta_slow > 0.0))
      refuse("rope_scaling.beta_fast", "YaRN needs beta_fast > beta_slow > 0");
  } else if (y.type.empty()) {
    if (!(y == RopeScaling{})) refuse("rope_scaling", "has values but no type (set type = \"yarn\")");
  } else {
    refuse("rope_scaling.type", "must be \"yarn\" or empty, got \"" + excerpt(y.type) + "\"");
  }

  for (const auto& [field, v] : {std::pair<const char*, int64_t>{"index_n_heads", c.index_n_heads},
                                 {"index_head_dim", c.index_head_dim},
                                 {"index_topk", c.index_topk}}) {
    if (has_ratio(c, 4))
      refuse.positive(field, v);
    else if (v < 0)
      refuse(field, "must not be negative");
  }
  if (has_ratio(c, 4) && (c.index_head_dim % 2 != 0 || c.index_head_dim < c.qk_rope_head_dim))
    refuse("index_head_dim", "must be even and >= qk_rope_head_dim=" + std::to_string(c.qk_rope_head_dim) +
                                 ", got " + std::to_string(c.index_head_dim));
}

// Routing: every layer MoE, one shared expert of the routed width, a
// selection bias, no group limit; hash routing for the first layers.
void validate_v4_moe(const ModelConfig& c, const Refuse& refuse) {
  if (c.n_shared_experts != 1)
    refuse("n_shared_experts",
           "DeepSeek-V4 has exactly one shared expert, got " + std::to_string(c.n_shared_experts));
  if (c.shared_expert_intermediate_size != c.moe_intermediate_size)
    refuse("shared_expert_intermediate_size", "DeepSeek-V4's shared expert has moe_intermediate_size=" +
                                                  std::to_string(c.moe_intermediate_size) + " rows");
  if (c.shared_expert_gate) refuse("shared_expert_gate", "DeepSeek-V4 has no shared-expert gate");
  if (!c.score_correction_bias)
    refuse("score_correction_bias",
           "DeepSeek-V4 always has the router bias (ffn.gate.bias) on non-hash layers");
  if (c.n_group != 1 || c.topk_group != 1) refuse("n_group", "DeepSeek-V4 has no group-limited routing");
  if (c.intermediate_size != 0)
    refuse("intermediate_size", "DeepSeek-V4 has no dense layer, so it must be 0");
  if (c.first_k_dense_replace != 0) refuse("first_k_dense_replace", "DeepSeek-V4 has no dense layer");
  if (c.decoder_sparse_step != 1) refuse("decoder_sparse_step", "DeepSeek-V4 has no dense layer");
  if (!c.mlp_only_layers.empty()) refuse("mlp_only_layers", "DeepSeek-V4 has no dense layer");
  if (c.num_hash_layers < 0 || c.num_hash_layers > c.num_layers)
    refuse("num_hash_layers", "must be in [0, num_layers=" + std::to_string(c.num_layers) + "], got " +
                                  std::to_string(c.num_hash_layers));
  if (!(c.swiglu_limit >= 0.0) || !std::isfinite(c.swiglu_limit))
    refuse("swiglu_limit", "must be finite and not negative (0 = no clamp)");
}

}  // namespace

void validate_v4(const ModelConfig& c, const std::string& source) {
  const Refuse refuse(source);
  if (c.num_experts <= 0)
    refuse("num_experts", "DeepSeek-V4 is an MoE architecture (num_experts must be > 0)");
  if (c.tie_word_embeddings)
    refuse("tie_word_embeddings", "DeepSeek-V4 has a separate head, so it must be false");
  validate_v4_attention(c, refuse);
  validate_v4_compression(c, refuse);
  validate_v4_moe(c, refuse);
  refuse.positive("hc_mult", c.hc_mult);
  refuse.positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  refuse.positive_finite("hc_eps", c.hc_eps);
  if (!c.expert_dtype.empty() && c.expert_dtype != "fp4" && c.expert_dtype != "fp8")
    refuse("expert_dtype",
           "must be \"fp4\", \"fp8\" or empty (bf16), got \"" + excerpt(c.expert_dtype) + "\"");
  // MXFP4 scales groups of 32 along a row: both widths of an expert.
  if (c.expert_dtype == "fp4" && (c.hidden_size % 32 != 0 || c.moe_intermediate_size % 32 != 0))
    refuse("expert_dtype",
           "\"fp4\" (MXFP4, one scale per 32 values) needs hidden_size and "
           "moe_intermediate_size to be multiples of 32, got " +
               std::to_string(c.hidden_size) + " and " + std::to_string(c.moe_intermediate_size));
}

void validate_no_v4_fields(const ModelConfig& c, const std::string& source) {
  const Refuse refuse(source);
  const ModelConfig d;  // the defaults
  const std::string why = std::string("set, but only DeepSeek-V4 has it (architecture is ") +
                          architecture_name(c.architecture) + ")";
  auto check = [&](bool at_default, const char* field) {
    if (!at_default) refuse(field, why);
  };
  check(c.router_scoring != RouterScoring::SqrtSoftplus, "router_scoring");
  check(c.q_lora_rank == d.q_lora_rank, "q_lora_rank");
  check(c.o_groups == d.o_groups, "o_groups");
  check(c.o_lora_rank == d.o_lora_rank, "o_lora_rank");
  check(c.qk_rope_head_dim == d.qk_rope_head_dim, "qk_rope_head_dim");
  check(c.sliding_window == d.sliding_window, "sliding_window");
  check(c.compress_ratios == d.compress_ratios, "compress_ratios");
  check(c.compress_rope_theta == d.compress_rope_theta, "compress_rope_theta");
  check(c.rope_scaling == d.rope_scaling, "rope_scaling");
  check(c.index_n_heads == d.index_n_heads, "index_n_heads");
  check(c.index_head_dim == d.index_head_dim, "index_head_dim");
  check(c.index_topk == d.index_topk, "index_topk");
  check(c.num_hash_layers == d.num_hash_layers, "num_hash_layers");
  check(c.swiglu_limit == d.swiglu_limit, "swiglu_limit");
  check(c.hc_mult == d.hc_mult, "hc_mult");
  check(c.hc_sinkhorn_iters == d.hc_sinkhorn_iters, "hc_sinkhorn_iters");
  check(c.hc_eps == d.hc_eps, "hc_eps");
  check(c.num_nextn_predict_layers == d.num_nextn_predict_layers, "num_nextn_predict_layers");
  check(c.expert_dtype == d.expert_dtype, "expert_dtype");
}

// ---- config.json ----

namespace {

RouterScoring scoring_of(const std::string& s, const std::string& source) {
  if (s == "sqrtsoftplus") return RouterScoring::SqrtSoftplus;
  if (s == "sigmoid") return RouterScoring::Sigmoid;
  if (s == "softmax") return RouterScoring::Softmax;
  LS_THROW << source << ": field 'scoring_func' must be \"sqrtsoftplus\", \"sigmoid\" or \"softmax\", got \""
           << excerpt(s) << "\"";
}

// {type, factor, original_max_position_embeddings, beta_fast, beta_slow};
// null, absent or type "default" = none.
RopeScaling read_rope_scaling(const JsonFields& f, const std::string& source) {
  RopeScaling y;
  if (!f.has("rope_scaling")) return y;
  const json& r = f.at("rope_scaling");
  if (!r.is_object())
    LS_THROW << source << ": field 'rope_scaling' must be an object or null, got " << excerpt(r.dump());
  const std::string where = source + ": rope_scaling";
  const JsonFields g(r, where);
  // transformers writes rope_type, the official file type.
  const std::string type = g.has("type") ? g.opt_string("type", "") : g.opt_string("rope_type", "");
  if (type.empty() || type == "default") return y;
  if (type != "yarn") f.unsupported("rope_scaling type '" + excerpt(type) + "' (only yarn)");
  y.type = type;
  y.factor = g.opt_double("factor", 1.0);
  y.original_max_position_embeddings = g.req_int("original_max_position_embeddings");
  y.beta_fast = g.opt_double("beta_fast", y.beta_fast);
  y.beta_slow = g.opt_double("beta_slow", y.beta_slow);
  return y;
}

}  // namespace

void read_v4_hf_json(const JsonFields& f, ModelConfig& c, const std::string& source) {
  c.num_kv_heads = f.opt_int("num_key_value_heads", 1);
  c.head_dim = f.req_int("head_dim");
  c.intermediate_size = 0;  // no dense layer; a stray key does not describe the model
  c.rope_theta = f.opt_double("rope_theta", 10000.0);
  c.q_lora_rank = f.req_int("q_lora_rank");
  c.o_groups = f.req_int("o_groups");
  c.o_lora_rank = f.req_int("o_lora_rank");
  c.qk_rope_head_dim = f.req_int("qk_rope_head_dim");
  c.sliding_window = f.req_int("sliding_window");
  if (!f.has("compress_ratios") || !f.at("compress_ratios").is_array())
    LS_THROW << source << ": missing required field 'compress_ratios' (a list, one per layer and MTP block)";
  c.compress_ratios = f.opt_int_list("compress_ratios");
  c.compress_rope_theta = f.opt_double("compress_rope_theta", 0.0);
  c.rope_scaling = read_rope_scaling(f, source);
  c.index_n_heads = f.opt_int("index_n_heads", 0);
  c.index_head_dim = f.opt_int("index_head_dim", 0);
  c.index_topk = f.opt_int("index_topk", 0);

  c.num_experts = f.req_int("n_routed_experts");
  c.num_experts_per_tok = f.req_int("num_experts_per_tok");
  c.moe_intermediate_size = f.req_int("moe_intermediate_size");
  c.n_shared_experts = f.opt_int("n_shared_experts", 1);
  c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  c.score_correction_bias = true;
  c.router_scoring = scoring_of(f.opt_string("scoring_func", "sqrtsoftplus"), source);
  c.routed_scaling_factor = f.opt_double("routed_scaling_factor", 1.0);
  c.norm_topk_prob = f.opt_bool("norm_topk_prob", true);
  const std::string topk_method = f.opt_string("topk_method", "noaux_tc");
  if (topk_method != "noaux_tc") f.unsupported("topk_method '" + excerpt(topk_method) + "' (only noaux_tc)");
  c.n_group = f.opt_int("n_group", 1);
  c.topk_group = f.opt_int("topk_group", 1);
  c.num_hash_layers = f.opt_int("num_hash_layers", 0);
  c.swiglu_limit = f.opt_double("swiglu_limit", 0.0);

  c.hc_mult = f.req_int("hc_mult");
  c.hc_sinkhorn_iters = f.opt_int("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  c.hc_eps = f.opt_double("hc_eps", c.hc_eps);
  c.num_nextn_predict_layers = f.opt_int("num_nextn_predict_layers", 0);
  c.expert_dtype = f.opt_string("expert_dtype", "");
  // quantization_config describes the checkpoint's storage: the loader's, not the model's.
}

void write_v4_hf_json(const ModelConfig& c, json& j) {
  j.erase("intermediate_size");
  j["attention_bias"] = false;
  j["q_lora_rank"] = c.q_lora_rank;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.sliding_window;
  j["compress_ratios"] = c.compress_ratios;
  j["compress_rope_theta"] = c.compress_rope_theta;
  const RopeScaling& y = c.rope_scaling;
  if (y.type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"type", y.type},
                         {"factor", y.factor},
                         {"original_max_position_embeddings", y.original_max_position_embeddings},
                         {"beta_fast", y.beta_fast},
                         {"beta_slow", y.beta_slow}};
  }
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["n_routed_experts"] = c.num_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hash_layers"] = c.num_hash_layers;
  j["scoring_func"] = router_scoring_name(c.router_scoring);
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["topk_method"] = "noaux_tc";
  j["swiglu_limit"] = c.swiglu_limit;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  if (!c.expert_dtype.empty()) j["expert_dtype"] = c.expert_dtype;
}

}  // namespace lockstep::config_detail
