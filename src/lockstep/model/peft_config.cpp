// LoraSpec and PEFT's adapter_config.json: written with the keys PEFT writes,
// read with every LoraConfig key classified as honoured, ignored (it only
// says how PEFT initialised or ran the adapter) or refused unless at its
// default (it changes the adapted model in a way lockstep does not apply).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/model/peft.h"

namespace lockstep {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

// PEFT's shorthand for every linear layer but the output layer.
constexpr const char* kAllLinear = "all-linear";

// Keys lockstep reads into LoraSpec.
constexpr const char* kReadKeys[] = {"peft_type",    "task_type",      "r",    "lora_alpha",
                                     "lora_dropout", "target_modules", "bias", "base_model_name_or_path"};

// Flags that change the adapted model (rsLoRA's scale, DoRA's magnitude,
// lora_bias's extra vector, Megatron's transposed weights, QALoRA's pooling):
// only false is honoured.
constexpr const char* kMustBeFalse[] = {"fan_in_fan_out", "use_rslora", "use_dora", "lora_bias",
                                        "use_qalora"};

// Settings that adapt other modules, other ranks or only some layers, or
// switch the adapter on and off per token: only null or empty is honoured.
constexpr const char* kMustBeEmpty[] = {
    "modules_to_save",         "rank_pattern",      "alpha_pattern",     "layers_to_transform",
    "exclude_modules",         "target_parameters", "layer_replication", "trainable_token_indices",
    "alora_invocation_tokens", "arrow_config"};

// Keys about how PEFT created, initialised or ran the adapter: they do not
// change W + s·B·A, so they are read and ignored.
constexpr const char* kIgnored[] = {
    "auto_mapping",   "revision",          "inference_mode",      "init_lora_weights", "layers_pattern",
    "loftq_config",   "eva_config",        "corda_config",        "megatron_config",   "megatron_core",
    "runtime_config", "qalora_group_size", "ensure_weight_tying", "peft_version"};

template <size_t N>
bool listed(const char* const (&keys)[N], const std::string& key) {
  return std::any_of(std::begin(keys), std::end(keys), [&](const char* k) { return key == k; });
}

bool empty_value(const json& v) {
  return v.is_null() || ((v.is_array() || v.is_object() || v.is_string()) && v.empty());
}

// The canonical order: lora_module_names(), then lora_v4_module_names(); -1
// if `m` is neither.
int module_index(const std::string& m) {
  const auto& names = lora_module_names();
  auto it = std::find(names.begin(), names.end(), m);
  if (it != names.end()) return static_cast<int>(it - names.begin());
  const auto& v4 = lora_v4_module_names();
  auto jt = std::find(v4.begin(), v4.end(), m);
  return jt == v4.end() ? -1 : static_cast<int>(names.size()) + static_cast<int>(jt - v4.begin());
}

std::string module_by_index(int i) {
  const auto& names = lora_module_names();
  return size_t(i) < names.size() ? names[size_t(i)] : lora_v4_module_names()[size_t(i) - names.size()];
}

void check_key(const std::string& source, const std::string& key, const json& v) {
  if (listed(kReadKeys, key) || listed(kIgnored, key)) return;
  if (listed(kMustBeFalse, key)) {
    if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return;
    LS_THROW << source << ": key \"" << key << "\" is " << excerpt(v.dump())
             << "; lockstep applies plain LoRA (W + lora_alpha / r · B · A) and supports only false here";
  }
  if (listed(kMustBeEmpty, key)) {
    if (empty_value(v)) return;
    LS_THROW << source << ": key \"" << key << "\" is " << excerpt(v.dump())
             << "; lockstep adapts the same target modules with one r and lora_alpha in every layer and "
                "supports only null or empty here";
  }
  // A key a newer PEFT added, left at null, false or empty, leaves its
  // feature off; any other value may change the adapter.
  if (empty_value(v) || (v.is_boolean() && !v.get<bool>())) return;
  LS_THROW << source << ": unknown key \"" << excerpt(key) << "\" = " << excerpt(v.dump())
           << " (not a key of PEFT's LoraConfig that lockstep knows; set, it may change the adapter)";
}

std::vector<std::string> read_targets(const std::string& source, const json& v) {
  if (v.is_string()) {
    if (v.get<std::string>() == kAllLinear) return lora_module_names();
    LS_THROW << source << ": key \"target_modules\" is the pattern " << excerpt(v.dump())
             << "; lockstep reads \"" << kAllLinear << "\" or a list of module names";
  }
  if (!v.is_array() || v.empty())
    LS_THROW << source << ": key \"target_modules\" must be a non-empty list of module names or \""
             << kAllLinear << "\"";
  std::vector<std::string> names;
  for (const auto& m : v) {
    if (!m.is_string())
      LS_THROW << source << ": key \"target_modules\": module names are strings, got " << excerpt(m.dump());
    names.push_back(m.get<std::string>());
  }
  try {
    return lora_target_modules(names);  // PEFT writes a set: any order
  } catch (const Error& e) {
    LS_THROW << source << ": key \"target_modules\": " << e.what();
  }
}

// The value of a required key, of the JSON type `ok` accepts.
template <typename Ok>
const json& required(const std::string& source, const json& j, const char* key, const char* what, Ok ok) {
  if (!j.contains(key)) LS_THROW << source << ": missing key \"" << key << "\"";
  const json& v = j.at(key);
  if (!ok(v))
    LS_THROW << source << ": key \"" << key << "\" must be " << what << ", got " << excerpt(v.dump());
  return v;
}

void read_identity(const std::string& source, const json& j) {
  const json& type =
      required(source, j, "peft_type", "a string", [](const json& v) { return v.is_string(); });
  if (type.get<std::string>() != "LORA")
    LS_THROW << source << ": key \"peft_type\" is " << excerpt(type.dump())
             << "; lockstep reads LoRA adapters (\"LORA\")";
  if (j.contains("task_type") && !j.at("task_type").is_null() && j.at("task_type") != "CAUSAL_LM")
    LS_THROW << source << ": key \"task_type\" is " << excerpt(j.at("task_type").dump())
             << "; lockstep adapts causal language models (\"CAUSAL_LM\")";
  if (j.contains("bias") && j.at("bias") != "none")
    LS_THROW << source << ": key \"bias\" is " << excerpt(j.at("bias").dump())
             << "; lockstep trains and merges no biases (\"none\" only)";
}

}  // namespace

const std::vector<std::string>& lora_module_names() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

const std::vector<std::string>& lora_v4_module_names() {
  static const std::vector<std::string> names = {"wq_a", "wkv", "wq_b", "wo_b", "w1", "w3", "w2"};
  return names;
}

// The message of a module lockstep cannot adapt.
[[noreturn]] static void throw_unknown_module(const std::string& m) {
  LS_THROW << "LoRA: target_modules: lockstep cannot adapt module \"" << excerpt(m)
           << "\" (it adapts q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; on DeepSeek-V4 "
              "wq_a, wkv, wq_b, wo_b, w1, w3, w2; or \""
           << kAllLinear << "\")";
}

std::vector<std::string> lora_target_modules(const std::vector<std::string>& names) {
  std::vector<int> idx;
  for (const auto& m : names) {
    if (m == kAllLinear) return lora_module_names();
    const int i = module_index(m);
    if (i < 0) throw_unknown_module(m);
    idx.push_back(i);
  }
  if (idx.empty()) LS_THROW << "LoRA: target_modules is empty";
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  std::vector<std::string> out;
  out.reserve(idx.size());
  for (int i : idx) out.push_back(module_by_index(i));
  return out;
}

bool LoraSpec::targets(const std::string& module) const {
  return std::find(target_modules.begin(), target_modules.end(), module) != target_modules.end();
}

void LoraSpec::validate() const {
  if (rank < 1) LS_THROW << "LoRA: r must be >= 1, got " << rank;
  if (!std::isfinite(alpha) || alpha == 0.0)
    LS_THROW << "LoRA: lora_alpha must be finite and non-zero, got " << alpha;
  if (!(dropout >= 0.0 && dropout < 1.0)) LS_THROW << "LoRA: lora_dropout must be in [0, 1), got " << dropout;
  if (target_modules.empty()) LS_THROW << "LoRA: target_modules is empty";
  int last = -1;
  for (const auto& m : target_modules) {
    const int i = module_index(m);
    if (i < 0) throw_unknown_module(m);
    if (i <= last)
      LS_THROW << "LoRA: target_modules must list each module once, in the order q, k, v, o, gate, up, down, "
                  "wq_a, wkv, wq_b, wo_b, w1, w3, w2 (lora_target_modules gives that order)";
    last = i;
  }
}

std::string adapter_config_json(const LoraSpec& spec) {
  spec.validate();
  ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["r"] = spec.rank;
  // PEFT writes an integral alpha as an integer.
  if (spec.alpha == std::floor(spec.alpha) && std::fabs(spec.alpha) < 1e15)
    j["lora_alpha"] = static_cast<int64_t>(spec.alpha);
  else
    j["lora_alpha"] = spec.alpha;
  j["lora_dropout"] = spec.dropout;
  j["target_modules"] = spec.target_modules;
  j["bias"] = "none";
  j["base_model_name_or_path"] = spec.base_model_name_or_path.empty()
                                     ? ordered_json(nullptr)
                                     : ordered_json(spec.base_model_name_or_path);
  j["fan_in_fan_out"] = false;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  j["modules_to_save"] = nullptr;
  j["rank_pattern"] = ordered_json::object();
  j["alpha_pattern"] = ordered_json::object();
  j["inference_mode"] = true;
  return j.dump(2) + "\n";
}

LoraSpec parse_adapter_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    LS_THROW << source << ": not valid JSON: " << excerpt(e.what(), kJsonErrorBytes);
  }
  if (!j.is_object()) LS_THROW << source << ": expected a JSON object";
  for (const auto& [key, v] : j.items()) check_key(source, key, v);
  read_identity(source, j);
  LoraSpec s;
  auto is_int = [](const json& v) { return v.is_number_integer(); };
  auto is_num = [](const json& v) { return v.is_number(); };
  s.rank = required(source, j, "r", "a positive integer", is_int).get<int64_t>();
  s.alpha = required(source, j, "lora_alpha", "a number", is_num).get<double>();
  s.dropout = j.contains("lora_dropout") && !j.at("lora_dropout").is_null()
                  ? required(source, j, "lora_dropout", "a number", is_num).get<double>()
                  : 0.0;
  if (!j.contains("target_modules")) LS_THROW << source << ": missing key \"target_modules\"";
  s.target_modules = read_targets(source, j.at("target_modules"));
  if (j.contains("base_model_name_or_path") && j.at("base_model_name_or_path").is_string())
    s.base_model_name_or_path = j.at("base_model_name_or_path").get<std::string>();
  try {
    s.validate();
  } catch (const Error& e) {
    LS_THROW << source << ": " << e.what();
  }
  return s;
}

void write_adapter_config(const std::string& dir, const LoraSpec& spec) {
  write_file_atomic((fs::path(dir) / kAdapterConfigFile).string(), adapter_config_json(spec));
}

LoraSpec read_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterConfigFile).string();
  return parse_adapter_config(read_file_text(path), path);
}

}  // namespace lockstep
