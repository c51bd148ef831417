// Internal to the model module: typed access to the fields of a Hugging Face
// config.json with the file name in every error (config.cpp, config_v4.cpp),
// and the DeepSeek-V4 parts of ModelConfig's validation and JSON mapping.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/model/config.h"

namespace lockstep::config_detail {

using json = nlohmann::json;

// Field access with the file name in every error. JSON null counts as absent,
// as Hugging Face writes null for unset optional fields.
class JsonFields {
 public:
  JsonFields(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const { return j_.at(key); }

  int64_t req_int(const char* key) const {
    if (!has(key)) LS_THROW << source_ << ": missing required field '" << key << "'";
    return to_int(key, j_.at(key));
  }
  int64_t opt_int(const char* key, int64_t def) const { return has(key) ? to_int(key, j_.at(key)) : def; }
  double opt_double(const char* key, double def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_number())
      LS_THROW << source_ << ": field '" << key << "' must be a number, got " << excerpt(v.dump());
    return v.get<double>();
  }
  bool opt_bool(const char* key, bool def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_boolean())
      LS_THROW << source_ << ": field '" << key << "' must be true or false, got " << excerpt(v.dump());
    return v.get<bool>();
  }
  std::string opt_string(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_string())
      LS_THROW << source_ << ": field '" << key << "' must be a string, got " << excerpt(v.dump());
    return v.get<std::string>();
  }
  // An integer or a list of integers (eos_token_id, mlp_only_layers).
  std::vector<int64_t> opt_int_list(const char* key) const {
    std::vector<int64_t> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    if (v.is_array()) {
      for (const json& x : v) out.push_back(to_int(key, x));
    } else {
      out.push_back(to_int(key, v));
    }
    return out;
  }
  const std::string& source() const { return source_; }
  [[noreturn]] void unsupported(const std::string& what) const {
    LS_THROW << source_ << ": " << what << " is not supported by lockstep";
  }

 private:
  int64_t to_int(const char* key, const json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    // 1e6-style integral floats appear in hand-written configs.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    LS_THROW << source_ << ": field '" << key << "' must be an integer, got " << excerpt(v.dump());
  }

  const json& j_;
  const std::string& source_;
};

// DeepSeek-V4 (config_v4.cpp). validate_v4: the V4-only checks of a V4
// config; validate_no_v4_fields: another architecture leaves every V4-only
// field at its default. Both throw Error "<source>: invalid <field>: <why>".
void validate_v4(const ModelConfig& c, const std::string& source);
void validate_no_v4_fields(const ModelConfig& c, const std::string& source);
// The V4 keys of an official config.json into c (architecture already set).
void read_v4_hf_json(const JsonFields& f, ModelConfig& c, const std::string& source);
// The V4 keys written by model_config_to_hf_json (over the common ones).
void write_v4_hf_json(const ModelConfig& c, json& j);

}  // namespace lockstep::config_detail
