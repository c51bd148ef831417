// Row-source dispatch on the file extension.
#include "lockstep/data/rows.h"

#include "lockstep/data/parquet.h"

namespace lockstep::data {

bool is_parquet_path(const std::string& path) {
  constexpr std::string_view kExt = ".parquet";
  return path.size() >= kExt.size() && path.compare(path.size() - kExt.size(), kExt.size(), kExt) == 0;
}

std::vector<JsonlRecord> read_rows(const std::string& path) {
  if (!is_parquet_path(path)) return read_jsonl(path);
  std::vector<nlohmann::json> rows = read_parquet(path);
  std::vector<JsonlRecord> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    out[i].line = int64_t(i) + 1;
    out[i].value = std::move(rows[i]);
  }
  return out;
}

}  // namespace lockstep::data
