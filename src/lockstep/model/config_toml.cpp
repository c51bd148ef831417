// lockstep's TOML [model] section: parsing (unknown keys are errors, every
// message names the file, line and key) and writing it back.
#include "lockstep/model/config_toml.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"

namespace lockstep {

namespace {

enum class Kind { Int, Bool, Double };

// The scalar keys; each is the ModelConfig field of the same name.
struct ScalarField {
  const char* key;
  Kind kind;
  int64_t ModelConfig::*i = nullptr;
  bool ModelConfig::*b = nullptr;
  double ModelConfig::*d = nullptr;
};

const std::vector<ScalarField>& scalar_fields() {
  static const std::vector<ScalarField> f = {
      {"vocab_size", Kind::Int, &ModelConfig::vocab_size},
      {"hidden_size", Kind::Int, &ModelConfig::hidden_size},
      {"num_layers", Kind::Int, &ModelConfig::num_layers},
      {"num_heads", Kind::Int, &ModelConfig::num_heads},
      {"num_kv_heads", Kind::Int, &ModelConfig::num_kv_heads},
      {"head_dim", Kind::Int, &ModelConfig::head_dim},
      {"intermediate_size", Kind::Int, &ModelConfig::intermediate_size},
      {"qk_norm", Kind::Bool, nullptr, &ModelConfig::qk_norm},
      {"qkv_bias", Kind::Bool, nullptr, &ModelConfig::qkv_bias},
      {"rope_theta", Kind::Double, nullptr, nullptr, &ModelConfig::rope_theta},
      {"rms_norm_eps", Kind::Double, nullptr, nullptr, &ModelConfig::rms_norm_eps},
      {"max_position_embeddings", Kind::Int, &ModelConfig::max_position_embeddings},
      {"tie_word_embeddings", Kind::Bool, nullptr, &ModelConfig::tie_word_embeddings},
      {"num_experts", Kind::Int, &ModelConfig::num_experts},
      {"num_experts_per_tok", Kind::Int, &ModelConfig::num_experts_per_tok},
      {"moe_intermediate_size", Kind::Int, &ModelConfig::moe_intermediate_size},
      {"norm_topk_prob", Kind::Bool, nullptr, &ModelConfig::norm_topk_prob},
      {"routed_scaling_factor", Kind::Double, nullptr, nullptr, &ModelConfig::routed_scaling_factor},
      {"score_correction_bias", Kind::Bool, nullptr, &ModelConfig::score_correction_bias},
      {"n_group", Kind::Int, &ModelConfig::n_group},
      {"topk_group", Kind::Int, &ModelConfig::topk_group},
      {"n_shared_experts", Kind::Int, &ModelConfig::n_shared_experts},
      {"shared_expert_intermediate_size", Kind::Int, &ModelConfig::shared_expert_intermediate_size},
      {"shared_expert_gate", Kind::Bool, nullptr, &ModelConfig::shared_expert_gate},
      {"first_k_dense_replace", Kind::Int, &ModelConfig::first_k_dense_replace},
      {"decoder_sparse_step", Kind::Int, &ModelConfig::decoder_sparse_step},
      {"bos_token_id", Kind::Int, &ModelConfig::bos_token_id},
  };
  return f;
}

// DeepSeek-V4's scalar keys: read for any architecture (validate() refuses
// them elsewhere), written only for V4.
const std::vector<ScalarField>& v4_scalar_fields() {
  static const std::vector<ScalarField> f = {
      {"q_lora_rank", Kind::Int, &ModelConfig::q_lora_rank},
      {"o_groups", Kind::Int, &ModelConfig::o_groups},
      {"o_lora_rank", Kind::Int, &ModelConfig::o_lora_rank},
      {"qk_rope_head_dim", Kind::Int, &ModelConfig::qk_rope_head_dim},
      {"sliding_window", Kind::Int, &ModelConfig::sliding_window},
      {"compress_rope_theta", Kind::Double, nullptr, nullptr, &ModelConfig::compress_rope_theta},
      {"index_n_heads", Kind::Int, &ModelConfig::index_n_heads},
      {"index_head_dim", Kind::Int, &ModelConfig::index_head_dim},
      {"index_topk", Kind::Int, &ModelConfig::index_topk},
      {"num_hash_layers", Kind::Int, &ModelConfig::num_hash_layers},
      {"swiglu_limit", Kind::Double, nullptr, nullptr, &ModelConfig::swiglu_limit},
      {"hc_mult", Kind::Int, &ModelConfig::hc_mult},
      {"hc_sinkhorn_iters", Kind::Int, &ModelConfig::hc_sinkhorn_iters},
      {"hc_eps", Kind::Double, nullptr, nullptr, &ModelConfig::hc_eps},
      {"num_nextn_predict_layers", Kind::Int, &ModelConfig::num_nextn_predict_layers},
  };
  return f;
}

const ScalarField* find_scalar(const std::string& key) {
  for (const auto* list : {&scalar_fields(), &v4_scalar_fields()})
    for (const ScalarField& f : *list)
      if (key == f.key) return &f;
  return nullptr;
}

// Keys that are not plain scalars.
constexpr const char* kOtherKeys[] = {"architecture",    "router_scoring", "mlp_only_layers", "eos_token_ids",
                                      "compress_ratios", "rope_scaling",   "expert_dtype"};

std::string all_keys() {
  std::vector<std::string> k;
  for (const auto& f : scalar_fields()) k.push_back(f.key);
  for (const auto& f : v4_scalar_fields()) k.push_back(f.key);
  for (const char* o : kOtherKeys) k.push_back(o);
  std::sort(k.begin(), k.end());
  std::string s;
  for (const auto& x : k) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "<source>:<line>: [model].<key>"
std::string where(const std::string& source, const toml::node& n, const std::string& key) {
  std::ostringstream os;
  os << source;
  if (n.source().begin.line > 0) os << ":" << n.source().begin.line;
  os << ": [model]." << excerpt(key);
  return os.str();
}

int64_t get_int(const toml::node& n, const std::string& at) {
  if (auto v = n.as_integer()) return v->get();
  LS_THROW << at << ": expected an integer";
}

std::vector<int64_t> get_int_list(const toml::node& n, const std::string& at) {
  std::vector<int64_t> out;
  if (auto arr = n.as_array()) {
    for (const toml::node& x : *arr) out.push_back(get_int(x, at));
  } else if (n.is_integer()) {
    out.push_back(get_int(n, at));
  } else {
    LS_THROW << at << ": expected an array of integers";
  }
  return out;
}

std::string get_string(const toml::node& n, const std::string& at) {
  if (auto v = n.as_string()) return v->get();
  LS_THROW << at << ": expected a string";
}

// TOML float text that reads back to exactly d (shortest round trip).
std::string toml_double(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string toml_int_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

double get_double(const toml::node& n, const std::string& at) {
  if (auto v = n.as_floating_point()) return v->get();
  if (auto w = n.as_integer()) return static_cast<double>(w->get());
  LS_THROW << at << ": expected a number";
}

void set_scalar(ModelConfig& c, const ScalarField& f, const toml::node& node, const std::string& at) {
  switch (f.kind) {
    case Kind::Int: c.*(f.i) = get_int(node, at); break;
    case Kind::Bool:
      if (auto v = node.as_boolean())
        c.*(f.b) = v->get();
      else
        LS_THROW << at << ": expected true or false";
      break;
    case Kind::Double: c.*(f.d) = get_double(node, at); break;
  }
}

RouterScoring get_scoring(const toml::node& n, const std::string& at) {
  const std::string s = get_string(n, at);
  if (s == "softmax") return RouterScoring::Softmax;
  if (s == "sigmoid") return RouterScoring::Sigmoid;
  if (s == "sqrtsoftplus") return RouterScoring::SqrtSoftplus;
  LS_THROW << at << ": expected \"softmax\", \"sigmoid\" or \"sqrtsoftplus\", got \"" << excerpt(s) << "\"";
}

// rope_scaling = { type = "yarn", factor = 16.0, original_max_position_embeddings = 65536,
//                  beta_fast = 32.0, beta_slow = 1.0 }; omitted keys keep their defaults.
RopeScaling get_rope_scaling(const toml::node& n, const std::string& at) {
  const toml::table* t = n.as_table();
  if (!t) LS_THROW << at << ": expected a table { type = \"yarn\", factor = ..., ... }";
  RopeScaling y;
  for (auto&& [k, v] : *t) {
    const std::string key(k.str());
    const std::string sub = at + "." + key;
    if (key == "type")
      y.type = get_string(v, sub);
    else if (key == "factor")
      y.factor = get_double(v, sub);
    else if (key == "original_max_position_embeddings")
      y.original_max_position_embeddings = get_int(v, sub);
    else if (key == "beta_fast")
      y.beta_fast = get_double(v, sub);
    else if (key == "beta_slow")
      y.beta_slow = get_double(v, sub);
    else
      LS_THROW << sub << ": unknown key '" << excerpt(key)
               << "' (known: type, factor, original_max_position_embeddings, beta_fast, beta_slow)";
  }
  return y;
}

void write_scalar(std::ostringstream& os, const ModelConfig& c, const ScalarField& f) {
  os << f.key << " = ";
  switch (f.kind) {
    case Kind::Int: os << c.*(f.i); break;
    case Kind::Bool: os << (c.*(f.b) ? "true" : "false"); break;
    case Kind::Double: os << toml_double(c.*(f.d)); break;
  }
  os << "\n";
}

// A TOML basic string; the values written here (an architecture name,
// "yarn", "fp4") need no escapes, checked so that a bad one cannot slip by.
std::string toml_string(const std::string& s) {
  for (char ch : s) LS_CHECK(ch != '"' && ch != '\\' && ch >= 0x20) << "unexpected character in " << s;
  return "\"" + s + "\"";
}

}  // namespace

ModelConfig model_config_from_toml(const toml::table& model, const std::string& source,
                                   const std::vector<std::string>& other_keys) {
  ModelConfig c;
  c.num_kv_heads = 0;  // 0 = "not given" until defaults are applied below
  c.head_dim = 0;
  bool has_arch = false;
  std::vector<std::string> seen;

  for (auto&& [k, node] : model) {
    const std::string key(k.str());
    const std::string at = where(source, node, key);
    if (std::find(other_keys.begin(), other_keys.end(), key) != other_keys.end()) continue;
    seen.push_back(key);
    if (const ScalarField* f = find_scalar(key)) {
      set_scalar(c, *f, node, at);
    } else if (key == "architecture") {
      try {
        c.architecture = parse_architecture(get_string(node, at));
      } catch (const Error& e) {
        LS_THROW << at << ": " << e.what();
      }
      has_arch = true;
    } else if (key == "router_scoring") {
      c.router_scoring = get_scoring(node, at);
    } else if (key == "mlp_only_layers") {
      c.mlp_only_layers = get_int_list(node, at);
    } else if (key == "eos_token_ids") {
      c.eos_token_ids = get_int_list(node, at);
    } else if (key == "compress_ratios") {
      c.compress_ratios = get_int_list(node, at);
    } else if (key == "rope_scaling") {
      c.rope_scaling = get_rope_scaling(node, at);
    } else if (key == "expert_dtype") {
      c.expert_dtype = get_string(node, at);
    } else {
      LS_THROW << at << ": unknown key '" << excerpt(key) << "' (known keys: " << all_keys() << ")";
    }
  }

  auto given = [&](const char* key) { return std::find(seen.begin(), seen.end(), key) != seen.end(); };
  for (const char* req : {"vocab_size", "hidden_size", "num_layers", "num_heads"})
    if (!given(req)) LS_THROW << source << ": [model]: missing required key '" << req << "'";
  if (c.num_experts > 0) {
    for (const char* req : {"num_experts_per_tok", "moe_intermediate_size"})
      if (!given(req))
        LS_THROW << source << ": [model]: missing required key '" << req << "' (num_experts > 0)";
  }
  // DeepSeek-V4 (named, or inferred from hc_mult) fixes what its config.json
  // cannot vary: one K = V head, one shared expert, the router bias, and
  // sqrtsoftplus unless router_scoring says otherwise.
  const bool v4 = has_arch ? c.architecture == Architecture::DeepseekV4 : c.hc_mult > 0;
  if (v4) {
    if (!given("n_shared_experts")) c.n_shared_experts = 1;
    if (!given("score_correction_bias")) c.score_correction_bias = true;
    if (!given("router_scoring")) c.router_scoring = RouterScoring::SqrtSoftplus;
  }
  if (!given("num_kv_heads")) c.num_kv_heads = v4 ? 1 : c.num_heads;
  if (!given("head_dim") && c.num_heads > 0) c.head_dim = c.hidden_size / c.num_heads;
  if (!given("shared_expert_intermediate_size"))
    c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  if (!has_arch) c.architecture = infer_architecture(c);
  c.validate(source + ": [model]");
  return c;
}

ModelConfig model_config_from_toml_string(const std::string& text, const std::string& source,
                                          const std::vector<std::string>& other_keys) {
  toml::table doc;
  try {
    doc = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    LS_THROW << source << ":" << e.source().begin.line << ":" << e.source().begin.column
             << ": TOML syntax error: " << excerpt(e.description(), 256);
  }
  const toml::node* m = doc.get("model");
  if (!m) LS_THROW << source << ": missing [model] section";
  const toml::table* t = m->as_table();
  if (!t) LS_THROW << source << ": 'model' must be a table ([model])";
  return model_config_from_toml(*t, source, other_keys);
}

ModelConfig model_config_from_toml_file(const std::string& path, const std::vector<std::string>& other_keys) {
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    LS_THROW << path << ":" << e.source().begin.line << ":" << e.source().begin.column
             << ": TOML error: " << excerpt(e.description(), 256);
  }
  const toml::node* m = doc.get("model");
  if (!m) LS_THROW << path << ": missing [model] section";
  const toml::table* t = m->as_table();
  if (!t) LS_THROW << path << ": 'model' must be a table ([model])";
  return model_config_from_toml(*t, path, other_keys);
}

std::string model_config_to_toml(const ModelConfig& c) {
  std::ostringstream os;
  os << "[model]\n";
  os << "architecture = \"" << architecture_name(c.architecture) << "\"\n";
  for (const auto& f : scalar_fields()) write_scalar(os, c, f);
  os << "router_scoring = \"" << router_scoring_name(c.router_scoring) << "\"\n";
  os << "mlp_only_layers = " << toml_int_list(c.mlp_only_layers) << "\n";
  os << "eos_token_ids = " << toml_int_list(c.eos_token_ids) << "\n";
  if (!c.is_v4()) return os.str();
  for (const auto& f : v4_scalar_fields()) write_scalar(os, c, f);
  os << "compress_ratios = " << toml_int_list(c.compress_ratios) << "\n";
  const RopeScaling& y = c.rope_scaling;
  os << "rope_scaling = { type = " << toml_string(y.type) << ", factor = " << toml_double(y.factor)
     << ", original_max_position_embeddings = " << y.original_max_position_embeddings
     << ", beta_fast = " << toml_double(y.beta_fast) << ", beta_slow = " << toml_double(y.beta_slow) << " }\n";
  os << "expert_dtype = " << toml_string(c.expert_dtype) << "\n";
  return os.str();
}

}  // namespace lockstep
