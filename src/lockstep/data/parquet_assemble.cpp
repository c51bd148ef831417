// Record assembly: each node reads its value from the leaves below it. The
// first leaf under a node decides whether the node is present (definition
// level) and whether a repeated node has another item (repetition level); a
// node that is absent consumes one entry from every leaf below it.
#include "lockstep/data/parquet_assemble.h"

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"

namespace lockstep::data::parquet {

namespace {

using nlohmann::json;

class Assembler {
 public:
  Assembler(const Schema& schema, std::vector<ColumnData>& columns)
      : schema_(schema), columns_(columns), pos_(columns.size(), 0), vpos_(columns.size(), 0) {}

  json row();
  void check_consumed() const;

 private:
  json node_value(int n, bool as_item);
  json repeated(int n);
  json item(int n);
  json object_of(const SchemaNode& node);
  void skip(const SchemaNode& node);
  const ColumnData& leaf_column(int leaf, size_t* at) const;
  [[noreturn]] void fail(int leaf, const std::string& what) const {
    LS_THROW << "column '" << excerpt(schema_.nodes[schema_.leaves[leaf]].path) << "': " << what;
  }

  const Schema& schema_;
  std::vector<ColumnData>& columns_;  // values are moved out into the rows
  std::vector<size_t> pos_;           // next entry of each leaf
  std::vector<size_t> vpos_;          // next value of each leaf
};

const ColumnData& Assembler::leaf_column(int leaf, size_t* at) const {
  const ColumnData& c = columns_[leaf];
  if (pos_[leaf] >= c.def.size()) fail(leaf, "fewer values than the rows need");
  *at = pos_[leaf];
  return c;
}

json Assembler::row() {
  for (size_t leaf = 0; leaf < columns_.size(); ++leaf) {
    size_t at = 0;
    if (leaf_column(int(leaf), &at).rep[at] != 0)
      fail(int(leaf), "a row starts with a nonzero repetition level");
  }
  return object_of(schema_.nodes[0]);
}

json Assembler::object_of(const SchemaNode& node) {
  json obj = json::object();
  for (int c : node.children) obj[schema_.nodes[c].element.name] = node_value(c, false);
  return obj;
}

void Assembler::skip(const SchemaNode& node) {
  for (int leaf = node.leaf_begin; leaf < node.leaf_end; ++leaf) {
    size_t at = 0;
    const ColumnData& c = leaf_column(leaf, &at);
    if (c.def[at] >= schema_.nodes[schema_.leaves[leaf]].def_level)
      fail(leaf, "definition levels disagree with the other columns of its group");
    ++pos_[leaf];
  }
}

// A node's value: null when absent, an array for a repeated node (unless it is
// read as one item of its own list), a map, list, object or scalar otherwise.
json Assembler::node_value(int n, bool as_item) {
  const SchemaNode& node = schema_.nodes[n];
  if (!as_item) {
    if (node.element.repetition == kRepeated) return repeated(n);
    size_t at = 0;
    const ColumnData& c = leaf_column(node.leaf_begin, &at);
    if (node.element.repetition == kOptional && c.def[at] < node.def_level) {
      skip(node);
      return nullptr;
    }
  }
  if (node.is_leaf()) {
    size_t at = 0;
    const ColumnData& c = leaf_column(node.leaf_begin, &at);
    if (c.def[at] != node.def_level) fail(node.leaf_begin, "a required value is missing");
    if (vpos_[node.leaf_begin] >= c.values.size()) fail(node.leaf_begin, "fewer values than its levels say");
    ++pos_[node.leaf_begin];
    return std::move(columns_[node.leaf_begin].values[vpos_[node.leaf_begin]++]);
  }
  if (node.is_list) return node_value(node.children[0], false);
  if (node.is_map) {
    const SchemaNode& kv = schema_.nodes[node.children[0]];
    const std::string& key_name = schema_.nodes[kv.children[0]].element.name;
    const std::string& value_name = schema_.nodes[kv.children[1]].element.name;
    json obj = json::object();
    for (auto& entry : repeated(node.children[0])) {
      const json& key = entry[key_name];
      const std::string name =
          key.is_string() ? key.get<std::string>() : key.dump(-1, ' ', false, json::error_handler_t::replace);
      obj[name] = std::move(entry[value_name]);
    }
    return obj;
  }
  return object_of(node);
}

json Assembler::item(int n) {
  const SchemaNode& node = schema_.nodes[n];
  return node.unwrap_element ? node_value(node.children[0], false) : node_value(n, true);
}

json Assembler::repeated(int n) {
  const SchemaNode& node = schema_.nodes[n];
  const int driver = node.leaf_begin;
  size_t at = 0;
  if (leaf_column(driver, &at).def[at] < node.def_level) {
    skip(node);
    return json::array();
  }
  json arr = json::array();
  for (;;) {
    arr.push_back(item(n));
    const ColumnData& c = columns_[driver];
    if (pos_[driver] >= c.def.size() || c.rep[pos_[driver]] != node.rep_level) break;
  }
  return arr;
}

void Assembler::check_consumed() const {
  for (size_t leaf = 0; leaf < columns_.size(); ++leaf)
    if (pos_[leaf] != columns_[leaf].def.size())
      fail(int(leaf),
           std::to_string(columns_[leaf].def.size() - pos_[leaf]) + " values more than the rows hold");
}

}  // namespace

void assemble_rows(const Schema& schema, std::vector<ColumnData>* columns, int64_t num_rows,
                   const std::string& file, int row_group, std::vector<nlohmann::json>* out) {
  Assembler a(schema, *columns);
  try {
    for (int64_t r = 0; r < num_rows; ++r) out->push_back(a.row());
    a.check_consumed();
  } catch (const Error& e) {
    LS_THROW << file << ": row group " << row_group << ": " << e.what();
  }
}

}  // namespace lockstep::data::parquet
