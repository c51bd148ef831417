// Small helpers for reading tokenizer.json / tokenizer_config.json fields with
// errors that name the file and the field path ("tokenizer.json: model.merges[3]").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/base/error.h"

namespace lockstep::tokenizer {

using Json = nlohmann::json;

// `where` is either a file ("dir/tokenizer.json:") or a field inside one.
inline std::string field_path(const std::string& where, const std::string& key) {
  if (!where.empty() && where.back() == ':') return where + " " + key;
  return where + "." + key;
}
inline std::string index_path(const std::string& where, size_t i) { return where + "[" + std::to_string(i) + "]"; }

inline const char* json_kind(const Json& j) { return j.type_name(); }

// A field that must exist (any type).
inline const Json& require_field(const Json& j, const char* key, const std::string& where) {
  if (!j.is_object()) LS_THROW << where << ": expected an object, got " << json_kind(j);
  auto it = j.find(key);
  if (it == j.end()) LS_THROW << field_path(where, key) << ": missing";
  return *it;
}

// nullptr when absent or null.
inline const Json* optional_field(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

inline std::string require_string(const Json& j, const char* key, const std::string& where) {
  const Json& v = require_field(j, key, where);
  if (!v.is_string()) LS_THROW << field_path(where, key) << ": expected a string, got " << json_kind(v);
  return v.get<std::string>();
}

inline std::optional<std::string> optional_string(const Json& j, const char* key, const std::string& where) {
  const Json* v = optional_field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) LS_THROW << field_path(where, key) << ": expected a string, got " << json_kind(*v);
  return v->get<std::string>();
}

inline bool get_bool(const Json& j, const char* key, const std::string& where, bool fallback) {
  const Json* v = optional_field(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) LS_THROW << field_path(where, key) << ": expected true or false, got " << json_kind(*v);
  return v->get<bool>();
}

inline int64_t get_int(const Json& j, const char* key, const std::string& where, int64_t fallback) {
  const Json* v = optional_field(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) LS_THROW << field_path(where, key) << ": expected an integer, got " << json_kind(*v);
  return v->get<int64_t>();
}

inline const Json& require_array(const Json& j, const char* key, const std::string& where) {
  const Json& v = require_field(j, key, where);
  if (!v.is_array()) LS_THROW << field_path(where, key) << ": expected an array, got " << json_kind(v);
  return v;
}

// The "type" of a component, e.g. "ByteLevel".
inline std::string component_type(const Json& j, const std::string& where) {
  if (!j.is_object()) LS_THROW << where << ": expected an object, got " << json_kind(j);
  return require_string(j, "type", where);
}

}  // namespace lockstep::tokenizer
