// The [lora] section (lora.h's LoraConfig): read apart from the adapters'
// products, so that the config readers link without the kernels.
#include <algorithm>

#include "lockstep/base/error.h"
#include "lockstep/model/lora.h"

namespace lockstep::model {

std::vector<std::string> LoraConfig::modules() const {
  return lora_target_modules(target_modules);
}

LoraConfig lora_config_from_toml(TomlSection& s) {
  LoraConfig c;
  c.rank = s.get_int("rank", 0, 0, 4096);
  c.alpha = s.get_double("alpha", c.alpha, 1e-12, 1e12);
  const double dropout = s.get_double("dropout", 0.0, 0.0, 1.0);
  if (dropout != 0.0)
    s.fail("dropout",
           "only 0 is supported: a dropout mask would make the trainer's forward differ from the rollout's, "
           "and lockstep's engines must agree bit for bit");
  c.target_modules = s.get_string_list("target_modules", c.target_modules);
  c.init_seed = static_cast<uint64_t>(s.get_int("init_seed", 0, 0));
  if (c.target_modules.empty()) s.fail("target_modules", "is empty: name at least one module");
  const auto& all = lora_module_names();
  const auto& v4 = lora_v4_module_names();
  for (const std::string& m : c.target_modules) {
    if (m == "all-linear") {
      if (c.target_modules.size() != 1) s.fail("target_modules", "\"all-linear\" must be the only entry");
      continue;
    }
    if (std::find(all.begin(), all.end(), m) == all.end() && std::find(v4.begin(), v4.end(), m) == v4.end())
      s.fail("target_modules",
             "unknown module \"" + m +
                 "\" (expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; on DeepSeek-V4 "
                 "wq_a, wkv, wq_b, wo_b, w1, w3, w2; or \"all-linear\")");
  }
  return c;
}

LoraConfig lora_config_from_root(const toml::table& root, const std::string& source) {
  TomlSection s(root["lora"].as_table(), source, "lora");
  LoraConfig c = lora_config_from_toml(s);
  s.finish();
  return c;
}

LoraSpec LoraConfig::spec(const std::string& base) const {
  LoraSpec s;
  s.rank = rank;
  s.alpha = alpha;
  s.dropout = 0.0;
  s.target_modules = modules();
  s.base_model_name_or_path = base;
  return s;
}

}  // namespace lockstep::model
