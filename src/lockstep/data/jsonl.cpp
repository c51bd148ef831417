// JSONL reader and atomic writer.
#include "lockstep/data/jsonl.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"

namespace lockstep::data {

std::vector<JsonlRecord> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) LS_THROW << absolute_path(path) << ": cannot open";
  std::vector<JsonlRecord> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    JsonlRecord r;
    r.line = n;
    try {
      r.value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e400
      LS_THROW << path << ":" << n << ": not valid JSON (" << excerpt(e.what(), kJsonErrorBytes) << ")";
    }
    if (!r.value.is_object())
      LS_THROW << path << ":" << n << ": expected a JSON object, got " << r.value.type_name();
    out.push_back(std::move(r));
  }
  return out;
}

const nlohmann::json& require_field(const JsonlRecord& r, const std::string& path, const std::string& key) {
  auto it = r.value.find(key);
  if (it == r.value.end()) LS_THROW << path << ":" << r.line << ": missing field '" << key << "'";
  return *it;
}

std::string require_string(const JsonlRecord& r, const std::string& path, const std::string& key) {
  const auto& v = require_field(r, path, key);
  if (!v.is_string()) LS_THROW << path << ":" << r.line << ": field '" << key << "' must be a string";
  return v.get<std::string>();
}

std::vector<int32_t> require_ids(const JsonlRecord& r, const std::string& path, const std::string& key) {
  const auto& v = require_field(r, path, key);
  if (!v.is_array())
    LS_THROW << path << ":" << r.line << ": field '" << key << "' must be an array of token ids";
  std::vector<int32_t> ids;
  for (const auto& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX)
      LS_THROW << path << ":" << r.line << ": field '" << key << "' must hold non-negative integer token ids";
    ids.push_back(e.get<int32_t>());
  }
  return ids;
}

void write_jsonl_atomic(const std::string& path, const std::vector<nlohmann::json>& lines) {
  std::string text;
  for (const auto& l : lines) text += l.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  write_file_atomic(path, text);
}

}  // namespace lockstep::data
