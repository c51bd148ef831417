// Parquet file reading: magic and footer, schema, then for each row group its
// column chunks decoded and assembled into rows.
#include "lockstep/data/parquet.h"

#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/data/parquet_assemble.h"
#include "lockstep/data/parquet_column.h"
#include "lockstep/data/parquet_format.h"
#include "lockstep/data/parquet_schema.h"

namespace lockstep::data {

namespace {

using namespace parquet;

constexpr char kMagic[] = "PAR1";
constexpr size_t kMagicSize = 4;

std::string join_path(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ".") + p;
  return s;
}

void check_row_group(const RowGroup& g, const Schema& schema, const std::string& name, int index) {
  if (g.columns.size() != schema.leaves.size())
    LS_THROW << name << ": row group " << index << " has " << g.columns.size() << " columns, the schema "
             << schema.leaves.size();
  for (size_t i = 0; i < g.columns.size(); ++i) {
    const std::string path = join_path(g.columns[i].path);
    if (path != schema.nodes[schema.leaves[i]].path)
      LS_THROW << name << ": row group " << index << " column " << i << " is '" << excerpt(path)
               << "', the schema says '" << excerpt(schema.nodes[schema.leaves[i]].path) << "'";
  }
  if (g.num_rows < 0) LS_THROW << name << ": row group " << index << " has a negative row count";
}

void check_value_counts(const FileMeta& meta, size_t size, const std::string& name) {
  const int64_t bound = kMaxValuesPerFileByte * int64_t(size) + kMinValuesBound;
  int64_t total = 0;
  for (const RowGroup& g : meta.row_groups) {
    for (const ColumnMeta& c : g.columns) {
      if (c.num_values < 0 || c.num_values > bound - total)
        LS_THROW << name << ": column '" << excerpt(join_path(c.path)) << "' claims " << c.num_values
                 << " values, more than a file of " << size << " bytes holds";
      total += c.num_values;
    }
  }
}

}  // namespace

std::vector<nlohmann::json> parse_parquet(const std::string& bytes, const std::string& name) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t size = bytes.size();
  if (size < 2 * kMagicSize + 4 || std::memcmp(data, kMagic, kMagicSize) != 0 ||
      std::memcmp(data + size - kMagicSize, kMagic, kMagicSize) != 0)
    LS_THROW << name << ": not a parquet file (no PAR1 magic at its start and end)";
  uint32_t footer_len = 0;
  std::memcpy(&footer_len, data + size - kMagicSize - 4, 4);
  if (footer_len > size - 2 * kMagicSize - 4)
    LS_THROW << name << ": footer length " << footer_len << " out of range for a file of " << size
             << " bytes";
  const size_t footer = size - kMagicSize - 4 - footer_len;
  const FileMeta meta = parse_file_meta(data + footer, footer_len, name);
  const Schema schema = build_schema(meta.schema, name);
  check_value_counts(meta, size, name);
  std::vector<nlohmann::json> rows;
  for (size_t g = 0; g < meta.row_groups.size(); ++g) {
    const RowGroup& group = meta.row_groups[g];
    check_row_group(group, schema, name, int(g));
    std::vector<ColumnData> columns;
    columns.reserve(group.columns.size());
    for (size_t c = 0; c < group.columns.size(); ++c)
      columns.push_back(
          read_column_chunk(data, footer, group.columns[c], schema.nodes[schema.leaves[c]], name, int(g)));
    assemble_rows(schema, &columns, group.num_rows, name, int(g), &rows);
  }
  return rows;
}

std::vector<nlohmann::json> read_parquet(const std::string& path) {
  return parse_parquet(read_file_text(path), path);
}

}  // namespace lockstep::data
