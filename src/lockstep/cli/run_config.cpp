// saved_config_text (run_config.h).
#include "lockstep/cli/run_config.h"

#include "lockstep/base/file_util.h"
#include "lockstep/base/toml_text.h"

namespace lockstep::cli {
namespace {

// A JSON scalar or array of scalars as a TOML node, into `t` under `key`;
// null (an unset option) is left out.
void put_json(toml::table& t, const std::string& key, const nlohmann::json& v) {
  if (v.is_string()) {
    t.insert(key, v.get<std::string>());
  } else if (v.is_boolean()) {
    t.insert(key, v.get<bool>());
  } else if (v.is_number_integer()) {
    t.insert(key, v.get<int64_t>());
  } else if (v.is_number()) {
    t.insert(key, v.get<double>());
  } else if (v.is_array()) {
    toml::array a;
    for (const auto& e : v) {
      if (e.is_string())
        a.push_back(e.get<std::string>());
      else if (e.is_number_integer())
        a.push_back(e.get<int64_t>());
      else if (e.is_number())
        a.push_back(e.get<double>());
    }
    t.insert(key, std::move(a));
  }
}

}  // namespace

std::string saved_config_text(const toml::table& root, const TomlRecorder& rec, const std::string& out_dir,
                              const nlohmann::json* reward) {
  toml::table full = rec.complete(root, {"dist"});
  if (!full.contains("train")) full.insert("train", toml::table{});
  full["train"].as_table()->insert_or_assign("out_dir", absolute_path(out_dir));
  if (reward) {
    if (!full.contains("reward")) full.insert("reward", toml::table{});
    toml::table& r = *full["reward"].as_table();
    for (const auto& [k, v] : reward->items())
      if (!r.contains(k)) put_json(r, k, v);
  }
  return toml_text(full);
}

}  // namespace lockstep::cli
