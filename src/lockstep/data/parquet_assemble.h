// Record assembly (Dremel): rebuilds one JSON object per row from the leaf
// columns' repetition and definition levels, following the schema tree.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/data/parquet_column.h"
#include "lockstep/data/parquet_schema.h"

namespace lockstep::data::parquet {

// Appends `num_rows` rows assembled from `*columns` (one per schema leaf; their
// values are moved into the rows) to *out. Errors name `file` and the row
// group when the levels disagree with each other, with the schema or with the
// row count.
void assemble_rows(const Schema& schema, std::vector<ColumnData>* columns, int64_t num_rows,
                   const std::string& file, int row_group, std::vector<nlohmann::json>* out);

}  // namespace lockstep::data::parquet
