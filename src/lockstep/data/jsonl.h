// JSONL reading with line numbers: every error names the file and the line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep::data {

struct JsonlRecord {
  int64_t line = 0;  // 1-based line number in the file
  nlohmann::json value;
};

// Reads every non-blank line as a JSON object. A line that is not valid JSON
// or not an object throws Error "<path>:<line>: ...".
std::vector<JsonlRecord> read_jsonl(const std::string& path);

// Field access with errors naming file, line and key.
const nlohmann::json& require_field(const JsonlRecord& r, const std::string& path, const std::string& key);
std::string require_string(const JsonlRecord& r, const std::string& path, const std::string& key);
std::vector<int32_t> require_ids(const JsonlRecord& r, const std::string& path, const std::string& key);

// Writes lines to `path` atomically (an AtomicFile: temporary file, fsync,
// rename); an Error naming `path` if any write fails.
void write_jsonl_atomic(const std::string& path, const std::vector<nlohmann::json>& lines);

}  // namespace lockstep::data
