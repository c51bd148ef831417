// Parquet files as rows: each row becomes the JSON object its JSONL line would
// be (nested structs as objects, lists as arrays, nulls as null). No Arrow:
// the footer, pages and record assembly are decoded here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lockstep::data {

// Every row of the file at `path`, in order. A bad or truncated file is an
// Error naming the file (and the column, when one is at fault).
std::vector<nlohmann::json> read_parquet(const std::string& path);

// The same from bytes already in memory; `name` is used in errors.
std::vector<nlohmann::json> parse_parquet(const std::string& bytes, const std::string& name);

}  // namespace lockstep::data
