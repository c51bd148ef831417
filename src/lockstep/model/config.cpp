// ModelConfig validation and the Hugging Face config.json mapping (read and
// write) for the supported architectures. The TOML side is in config_toml.cpp.
#include "lockstep/model/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/model/config_detail.h"

namespace lockstep {

namespace {
// Bounds far above any real model (DeepSeek-V3: L 61, D 7168, V 129280): they
// keep the per-layer loops of reading and validation short and any product of
// two sizes within int64; a config.json past them is broken, not large.
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxSize = int64_t{1} << 24;
}  // namespace

using json = nlohmann::json;
using config_detail::JsonFields;

namespace {

struct ArchInfo {
  Architecture arch;
  const char* name;
  const char* model_type;
};

constexpr ArchInfo kArchs[] = {
    {Architecture::Llama, "LlamaForCausalLM", "llama"},
    {Architecture::Qwen2, "Qwen2ForCausalLM", "qwen2"},
    {Architecture::Qwen3, "Qwen3ForCausalLM", "qwen3"},
    {Architecture::Qwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe"},
    {Architecture::Qwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
    {Architecture::Dots1, "Dots1ForCausalLM", "dots1"},
    {Architecture::DeepseekV4, "DeepseekV4ForCausalLM", "deepseek_v4"},
};

const ArchInfo& arch_info(Architecture a) {
  for (const auto& i : kArchs)
    if (i.arch == a) return i;
  LS_CHECK(false) << "unknown Architecture value " << static_cast<int>(a);
  return kArchs[0];
}

bool is_moe_arch(Architecture a) {
  return a == Architecture::Qwen2Moe || a == Architecture::Qwen3Moe || a == Architecture::Dots1 ||
         a == Architecture::DeepseekV4;
}

// Layers whose FFN is dense, by index.
std::vector<int64_t> dense_layers(const ModelConfig& c) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (!c.is_moe_layer(i)) out.push_back(i);
  return out;
}

}  // namespace

const char* architecture_name(Architecture a) {
  return arch_info(a).name;
}
const char* architecture_model_type(Architecture a) {
  return arch_info(a).model_type;
}

std::string supported_architectures() {
  std::string s;
  for (const auto& i : kArchs) s += (s.empty() ? "" : ", ") + std::string(i.name);
  return s;
}

Architecture parse_architecture(const std::string& name) {
  for (const auto& i : kArchs)
    if (name == i.name) return i.arch;
  if (name == "DeepseekV3ForCausalLM" || name == "DeepseekV2ForCausalLM")
    LS_THROW << "architecture " << name
             << " uses multi-head latent attention (MLA), which lockstep does not support; supported: "
             << supported_architectures();
  LS_THROW << "unsupported architecture '" << excerpt(name) << "'; supported: " << supported_architectures();
}

const char* router_scoring_name(RouterScoring s) {
  switch (s) {
    case RouterScoring::Softmax: return "softmax";
    case RouterScoring::Sigmoid: return "sigmoid";
    case RouterScoring::SqrtSoftplus: return "sqrtsoftplus";
  }
  LS_CHECK(false) << "unknown RouterScoring value " << static_cast<int>(s);
  return "";
}

// DeepSeek-V4 has no dense layer: its main layers and its MTP blocks (layers
// L .. L + num_nextn_predict_layers - 1 here) are all MoE, as validate() makes
// the dense-layer fields say.
bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (layer < first_k_dense_replace) return false;
  if (decoder_sparse_step > 1 && (layer + 1) % decoder_sparse_step != 0) return false;
  return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

namespace {

// What the architecture's config.json can express (so a saved model loads in
// Hugging Face tools and computes the same function).
void validate_architecture_fields(const ModelConfig& c, const std::string& source) {
  auto fail = [&](const std::string& field, const std::string& why) {
    LS_THROW << source << ": invalid " << field << ": " << why;
  };
  const std::string arch = architecture_name(c.architecture);
  auto need = [&](bool ok, const char* field, const std::string& why) {
    if (!ok) fail(field, arch + " " + why);
  };
  need(is_moe_arch(c.architecture) == c.is_moe(), "num_experts",
       c.is_moe() ? "is a dense architecture (num_experts must be 0)"
                : "is an MoE architecture (num_experts must be > 0)");
  switch (c.architecture) {
    case Architecture::Llama:
      need(!c.qk_norm, "qk_norm", "has no q/k norm");
      need(!c.qkv_bias, "qkv_bias", "has no q/k/v bias (its attention_bias also adds an o_proj bias)");
      break;
    case Architecture::Qwen2:
    case Architecture::Qwen2Moe:
      need(c.qkv_bias, "qkv_bias", "always has q/k/v biases");
      need(!c.qk_norm, "qk_norm", "has no q/k norm");
      break;
    case Architecture::Qwen3:
    case Architecture::Qwen3Moe:
    case Architecture::Dots1:
      need(c.qk_norm, "qk_norm", "always has q/k norm");
      need(!c.qkv_bias, "qkv_bias", "has no q/k/v-only bias");
      break;
    case Architecture::DeepseekV4:
      need(!c.qk_norm, "qk_norm", "normalises its low-rank query and its kv instead (no per-head q/k norm)");
      need(!c.qkv_bias, "qkv_bias", "has no q/k/v bias");
      break;
  }

  if (c.architecture == Architecture::Qwen2Moe || c.architecture == Architecture::Qwen3Moe) {
    need(c.router_scoring == RouterScoring::Softmax, "router_scoring", "routes with softmax");
    need(!c.score_correction_bias, "score_correction_bias", "has no score-correction bias");
    need(c.routed_scaling_factor == 1.0, "routed_scaling_factor", "has no routed scaling (must be 1)");
    need(c.n_group == 1 && c.topk_group == 1, "n_group", "has no group-limited routing");
  }
  if (c.architecture == Architecture::Qwen3Moe)
    need(c.n_shared_experts == 0, "n_shared_experts", "has no shared expert");
  if (c.architecture == Architecture::Qwen2Moe) {
    need(c.n_shared_experts == 1, "n_shared_experts", "has exactly one shared expert");
    need(c.shared_expert_gate, "shared_expert_gate", "gates its shared expert (must be true)");
  }
  if (c.architecture == Architecture::Dots1) {
    need(c.router_scoring == RouterScoring::Sigmoid, "router_scoring", "routes with sigmoid");
    need(c.score_correction_bias, "score_correction_bias", "always has a score-correction bias");
    need(c.n_shared_experts >= 1, "n_shared_experts", "needs at least one shared expert");
    need(c.shared_expert_intermediate_size == c.n_shared_experts * c.moe_intermediate_size,
         "shared_expert_intermediate_size", "needs n_shared_experts * moe_intermediate_size");
    need(!c.shared_expert_gate, "shared_expert_gate", "has no shared-expert gate");
    // dots.llm1 knows only "the first k layers are dense".
    const auto dense = dense_layers(c);
    for (size_t i = 0; i < dense.size(); ++i)
      need(dense[i] == static_cast<int64_t>(i), "mlp_only_layers",
           "can only make a prefix of the layers dense (first_k_dense_replace)");
  }
}

}  // namespace

void ModelConfig::validate(const std::string& source) const {
  auto fail = [&](const std::string& field, const std::string& why) {
    LS_THROW << source << ": invalid " << field << ": " << why;
  };
  auto positive = [&](const char* field, int64_t v, int64_t max = INT64_MAX) {
    if (v <= 0) fail(field, "must be positive, got " + std::to_string(v));
    if (v > max) fail(field, std::to_string(v) + " is above " + std::to_string(max));
  };
  positive("vocab_size", vocab_size, kMaxSize);
  positive("hidden_size", hidden_size, kMaxSize);
  positive("num_layers", num_layers, kMaxLayers);
  positive("num_heads", num_heads, kMaxSize);
  positive("num_kv_heads", num_kv_heads, kMaxSize);
  positive("head_dim", head_dim, kMaxSize);
  positive("max_position_embeddings", max_position_embeddings);
  if (num_heads % num_kv_heads != 0)
    fail("num_kv_heads", "num_heads (" + std::to_string(num_heads) + ") is not a multiple of num_kv_heads (" +
                             std::to_string(num_kv_heads) + ")");
  if (head_dim % 2 != 0)
    fail("head_dim", "RoPE rotates pairs, so it must be even, got " + std::to_string(head_dim));
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta)) fail("rope_theta", "must be positive and finite");
  if (!(rms_norm_eps > 0.0) || !std::isfinite(rms_norm_eps))
    fail("rms_norm_eps", "must be positive and finite");
  if (intermediate_size < 0) fail("intermediate_size", "must not be negative");

  if (num_experts < 0) fail("num_experts", "must not be negative");
  if (num_experts == 0) {
    // MoE fields on a dense model are a mistake, not something to ignore.
    if (num_experts_per_tok != 0) fail("num_experts_per_tok", "set, but num_experts is 0 (a dense model)");
    if (n_shared_experts != 0) fail("n_shared_experts", "set, but num_experts is 0 (a dense model)");
  } else {
    if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts)
      fail("num_experts_per_tok", "must be in [1, num_experts=" + std::to_string(num_experts) + "], got " +
                                      std::to_string(num_experts_per_tok));
    positive("moe_intermediate_size", moe_intermediate_size);
    if (!(routed_scaling_factor > 0.0) || !std::isfinite(routed_scaling_factor))
      fail("routed_scaling_factor", "must be positive and finite");
    positive("n_group", n_group);
    if (num_experts % n_group != 0) fail("n_group", "must divide num_experts=" + std::to_string(num_experts));
    if (topk_group < 1 || topk_group > n_group) fail("topk_group", "must be in [1, n_group]");
    if (topk_group * (num_experts / n_group) < num_experts_per_tok)
      fail("topk_group", "the selected groups hold fewer than num_experts_per_tok experts");
    positive("decoder_sparse_step", decoder_sparse_step);
    if (first_k_dense_replace < 0 || first_k_dense_replace > num_layers)
      fail("first_k_dense_replace", "must be in [0, num_layers]");
    for (int64_t l : mlp_only_layers)
      if (l < 0 || l >= num_layers) fail("mlp_only_layers", "layer " + std::to_string(l) + " out of range");
    if (n_shared_experts < 0) fail("n_shared_experts", "must not be negative");
    if (n_shared_experts > 0 && shared_expert_intermediate_size <= 0)
      fail("shared_expert_intermediate_size", "must be positive when there are shared experts");
  }
  if (n_shared_experts == 0 && shared_expert_intermediate_size != 0)
    fail("shared_expert_intermediate_size", "set, but n_shared_experts is 0");
  if (n_shared_experts == 0 && shared_expert_gate)
    fail("shared_expert_gate", "set, but there is no shared expert");
  // Before the dense-layer check below: V4 names its own reason for a dense layer.
  if (is_v4())
    config_detail::validate_v4(*this, source);
  else
    config_detail::validate_no_v4_fields(*this, source);
  if (!dense_layers(*this).empty() && intermediate_size <= 0)
    fail("intermediate_size", "must be positive: some layers have a dense FFN");
  if (bos_token_id < -1 || bos_token_id >= vocab_size) fail("bos_token_id", "outside [0, vocab_size)");
  for (int64_t e : eos_token_ids)
    if (e < 0 || e >= vocab_size) fail("eos_token_ids", std::to_string(e) + " outside [0, vocab_size)");

  validate_architecture_fields(*this, source);
}

Architecture infer_architecture(const ModelConfig& c) {
  // Only DeepSeek-V4 has mHC streams; without them it is never inferred.
  if (c.hc_mult > 0) return Architecture::DeepseekV4;
  if (!c.is_moe()) {
    if (c.qkv_bias) return Architecture::Qwen2;
    if (c.qk_norm) return Architecture::Qwen3;
    return Architecture::Llama;
  }
  if (c.router_scoring == RouterScoring::Sigmoid || c.score_correction_bias ||
      (c.n_shared_experts > 0 && !c.shared_expert_gate))
    return Architecture::Dots1;
  if (c.qkv_bias || c.shared_expert_gate) return Architecture::Qwen2Moe;
  return Architecture::Qwen3Moe;
}

// ---- config.json reading ----

namespace {

Architecture architecture_of(const JsonFields& f, const std::string& source) {
  std::string name;
  if (f.has("architectures")) {
    const json& a = f.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      LS_THROW << source << ": field 'architectures' must be a non-empty list of strings";
    name = a[0].get<std::string>();
  } else if (f.has("model_type")) {
    const std::string mt = f.opt_string("model_type", "");
    for (const auto& i : kArchs)
      if (mt == i.model_type) return i.arch;
    if (mt == "deepseek_v3") {
      name = "DeepseekV3ForCausalLM";  // rejected below with the MLA message
    } else if (mt == "deepseek_v2") {
      name = "DeepseekV2ForCausalLM";
    } else {
      LS_THROW << source << ": unsupported model_type '" << excerpt(mt)
               << "'; supported architectures: " << supported_architectures();
    }
  } else {
    LS_THROW << source << ": missing required field 'architectures'";
  }
  try {
    return parse_architecture(name);
  } catch (const Error& e) {
    LS_THROW << source << ": " << e.what();
  }
}

void read_rope(const JsonFields& f, ModelConfig& c) {
  c.rope_theta = f.opt_double("rope_theta", 10000.0);
  auto check_type = [&](const json& r, const char* field) {
    if (!r.is_object()) return;
    std::string type = "default";
    for (const char* key : {"type", "rope_type"}) {  // rope_type wins when both are there
      if (!r.contains(key)) continue;
      if (!r.at(key).is_string())
        LS_THROW << f.source() << ": " << field << "." << key << " must be a string, got "
                 << excerpt(r.at(key).dump());
      type = r.at(key).get<std::string>();
    }
    if (type != "default")
      f.unsupported(std::string("RoPE scaling (") + field + ".rope_type = '" + excerpt(type) + "')");
  };
  if (f.has("rope_scaling")) check_type(f.at("rope_scaling"), "rope_scaling");
  // transformers >= 5 writes rope_parameters {rope_theta, rope_type}.
  if (f.has("rope_parameters")) {
    const json& rp = f.at("rope_parameters");
    check_type(rp, "rope_parameters");
    if (rp.is_object() && rp.contains("rope_theta") && rp.at("rope_theta").is_number())
      c.rope_theta = rp.at("rope_theta").get<double>();
  }
}

}  // namespace

ModelConfig model_config_from_hf_json(const json& j, const std::string& source) {
  if (!j.is_object()) LS_THROW << source << ": expected a JSON object";
  JsonFields f(j, source);
  ModelConfig c;
  c.architecture = architecture_of(f, source);
  const Architecture a = c.architecture;

  c.vocab_size = f.req_int("vocab_size");
  c.hidden_size = f.req_int("hidden_size");
  c.num_layers = f.req_int("num_hidden_layers");
  c.num_heads = f.req_int("num_attention_heads");
  c.num_kv_heads = f.opt_int("num_key_value_heads", c.num_heads);
  // Qwen3Config defaults head_dim to 128; the others use D / H.
  const int64_t default_head_dim =
      a == Architecture::Qwen3 ? 128 : (c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.head_dim = f.opt_int("head_dim", default_head_dim);
  c.intermediate_size = f.opt_int("intermediate_size", 0);
  c.rms_norm_eps = f.opt_double("rms_norm_eps", 1e-6);
  c.max_position_embeddings = f.opt_int(
      "max_position_embeddings", (a == Architecture::Llama || a == Architecture::Dots1) ? 2048 : 32768);
  c.tie_word_embeddings = f.opt_bool("tie_word_embeddings", false);
  // DeepSeek-V4 reads its YaRN rope_scaling and its sliding window itself.
  if (a != Architecture::DeepseekV4) read_rope(f, c);

  const std::string act = f.opt_string("hidden_act", "silu");
  if (act != "silu") f.unsupported("hidden_act '" + excerpt(act) + "' (only silu)");
  // attention_bias puts a bias on o_proj too, which lockstep does not model.
  if (a != Architecture::Qwen2 && a != Architecture::Qwen2Moe && f.opt_bool("attention_bias", false))
    f.unsupported("attention_bias = true (q/k/v/o projection biases)");
  if (a == Architecture::Llama && f.opt_bool("mlp_bias", false)) f.unsupported("mlp_bias = true");
  if (f.opt_bool("use_sliding_window", false))
    f.unsupported("sliding-window attention (use_sliding_window = true)");
  if (a == Architecture::Dots1 && f.has("sliding_window") &&
      f.opt_int("max_window_layers", 62) < c.num_layers)
    f.unsupported("sliding-window attention (sliding_window set and max_window_layers < num_hidden_layers)");
  if (f.has("layer_types") && f.at("layer_types").is_array())
    for (const json& t : f.at("layer_types"))
      if (t.is_string() && t.get<std::string>() != "full_attention")
        f.unsupported("layer type '" + excerpt(t.get<std::string>()) + "'");

  c.qk_norm = a == Architecture::Qwen3 || a == Architecture::Qwen3Moe || a == Architecture::Dots1;
  c.qkv_bias = (a == Architecture::Qwen2 || a == Architecture::Qwen2Moe) && f.opt_bool("qkv_bias", true);

  switch (a) {
    case Architecture::Llama:
    case Architecture::Qwen2:
    case Architecture::Qwen3: c.intermediate_size = f.req_int("intermediate_size"); break;
    case Architecture::Qwen2Moe:
    case Architecture::Qwen3Moe: {
      // transformers >= 5 may write num_local_experts (its attribute_map alias).
      c.num_experts = f.has("num_local_experts") && !f.has("num_experts") ? f.req_int("num_local_experts")
                                                                          : f.req_int("num_experts");
      c.num_experts_per_tok = f.req_int("num_experts_per_tok");
      c.moe_intermediate_size = f.req_int("moe_intermediate_size");
      c.norm_topk_prob = f.opt_bool("norm_topk_prob", false);
      c.decoder_sparse_step = f.opt_int("decoder_sparse_step", 1);
      c.mlp_only_layers = f.opt_int_list("mlp_only_layers");
      if (a == Architecture::Qwen2Moe) {
        c.shared_expert_intermediate_size = f.req_int("shared_expert_intermediate_size");
        c.n_shared_experts = 1;
        c.shared_expert_gate = true;
      }
      break;
    }
    case Architecture::Dots1:
      c.num_experts = f.req_int("n_routed_experts");
      c.num_experts_per_tok = f.req_int("num_experts_per_tok");
      c.moe_intermediate_size = f.req_int("moe_intermediate_size");
      c.n_shared_experts = f.req_int("n_shared_experts");
      c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
      c.first_k_dense_replace = f.opt_int("first_k_dense_replace", 0);
      c.norm_topk_prob = f.opt_bool("norm_topk_prob", false);
      c.routed_scaling_factor = f.opt_double("routed_scaling_factor", 1.0);
      c.n_group = f.opt_int("n_group", 1);
      c.topk_group = f.opt_int("topk_group", 1);
      c.router_scoring = RouterScoring::Sigmoid;
      c.score_correction_bias = true;
      break;
    case Architecture::DeepseekV4: config_detail::read_v4_hf_json(f, c, source); break;
  }
  // Dense layers must know their width; the MoE architectures only need it
  // when some layer is dense. (Past kMaxLayers, validate() refuses the count
  // before anything walks that many layers.)
  if (c.is_moe() && c.intermediate_size <= 0 && c.num_layers <= kMaxLayers) {
    bool any_dense = false;
    for (int64_t i = 0; i < c.num_layers; ++i) any_dense |= !c.is_moe_layer(i);
    if (any_dense) c.intermediate_size = f.req_int("intermediate_size");
  }

  c.bos_token_id = f.opt_int("bos_token_id", -1);
  c.eos_token_ids = f.opt_int_list("eos_token_id");
  c.validate(source);
  return c;
}

ModelConfig load_hf_config(const std::string& path) {
  const std::string text = read_file_text(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e400
    LS_THROW << path << ": invalid JSON: " << excerpt(e.what(), kJsonErrorBytes);
  }
  return model_config_from_hf_json(j, path);
}

// ---- config.json writing ----

json model_config_to_hf_json(const ModelConfig& c, DType dtype) {
  c.validate("model config to save");
  LS_CHECK(dtype == DType::F32 || dtype == DType::BF16)
      << "checkpoint dtype must be f32 or bf16, got " << dtype_name(dtype);
  const Architecture a = c.architecture;
  json j;
  j["architectures"] = json::array({architecture_name(a)});
  j["model_type"] = architecture_model_type(a);
  j["torch_dtype"] = dtype == DType::BF16 ? "bfloat16" : "float32";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids[0];
  else
    j["eos_token_id"] = c.eos_token_ids;

  if (a == Architecture::Llama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (a == Architecture::DeepseekV4) {
    config_detail::write_v4_hf_json(c, j);
  } else {
    if (a != Architecture::Qwen2 && a != Architecture::Qwen2Moe) j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  if (a == Architecture::Qwen2Moe || a == Architecture::Qwen3Moe) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    // first_k_dense_replace has no Qwen field: fold it into mlp_only_layers.
    std::set<int64_t> only(c.mlp_only_layers.begin(), c.mlp_only_layers.end());
    for (int64_t i = 0; i < c.first_k_dense_replace; ++i) only.insert(i);
    j["mlp_only_layers"] = std::vector<int64_t>(only.begin(), only.end());
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.001;
    if (a == Architecture::Qwen2Moe) {
      j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
      j["qkv_bias"] = true;
    }
  }
  if (a == Architecture::Dots1) {
    int64_t k = 0;  // validate() checked that the dense layers form a prefix
    while (k < c.num_layers && !c.is_moe_layer(k)) ++k;
    j["n_routed_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["n_shared_experts"] = c.n_shared_experts;
    j["first_k_dense_replace"] = k;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
  }
  return j;
}

void save_hf_config(const std::string& path, const ModelConfig& c, DType dtype) {
  write_file_atomic(path, model_config_to_hf_json(c, dtype).dump(2) + "\n");
}

}  // namespace lockstep
