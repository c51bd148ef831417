// Decoding one column chunk of a parquet file into its repetition and
// definition levels and its non-null values (as JSON scalars), page by page.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/data/parquet_format.h"
#include "lockstep/data/parquet_schema.h"

namespace lockstep::data::parquet {

struct ColumnData {
  std::vector<uint8_t> rep;            // one per entry
  std::vector<uint8_t> def;            // one per entry
  std::vector<nlohmann::json> values;  // one per entry whose def is the leaf's def_level
};

// A data page may not claim more entries than this: levels of all-null pages
// compress to almost nothing, so the bytes alone do not bound the count.
constexpr int64_t kMaxPageValues = int64_t(1) << 24;

// Nor may a file's column chunks together claim more than this many entries
// per byte of the file (plus kMinValuesBound): runs of one repeated value cost
// a few bytes however long, but a real dataset's rows cost bytes in some
// column, and the bound keeps a small corrupt file from expanding into a huge
// row count.
constexpr int64_t kMaxValuesPerFileByte = 64;
constexpr int64_t kMinValuesBound = 4096;

// Reads the chunk described by `meta` from file bytes [data, data + limit)
// (limit: where the footer starts). Errors name `file`, the column's path and
// the row group.
ColumnData read_column_chunk(const uint8_t* data, size_t limit, const ColumnMeta& meta,
                             const SchemaNode& leaf, const std::string& file, int row_group);

// PLAIN values of one physical type (exposed for tests).
std::vector<nlohmann::json> decode_plain(const uint8_t* data, size_t size, const SchemaElement& leaf,
                                         size_t count);

}  // namespace lockstep::data::parquet
