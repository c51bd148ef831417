// Dataset rows from any supported file: JSONL (one object per line) or
// parquet (one object per row), chosen by the file's extension.
#pragma once

#include <string>
#include <vector>

#include "lockstep/data/jsonl.h"

namespace lockstep::data {

// True for a path ending in ".parquet".
bool is_parquet_path(const std::string& path);

// The rows of `path` as records: for JSONL `line` is the line number, for
// parquet the row number (counting from 1), so errors that name "<path>:<n>"
// point at the row.
std::vector<JsonlRecord> read_rows(const std::string& path);

}  // namespace lockstep::data
