// A parquet schema as a tree: each node's definition and repetition levels,
// its leaf columns, and how it maps to JSON (object, array, map, value).
#pragma once

#include <string>
#include <vector>

#include "lockstep/data/parquet_format.h"

namespace lockstep::data::parquet {

struct SchemaNode {
  SchemaElement element;
  std::string path;           // dotted, from the root's children ("prompt.list.element.role")
  std::vector<int> children;  // node indices
  int def_level = 0;          // definition level once this node is present
  int rep_level = 0;          // repetition level of the innermost repeated node at or above it
  int leaf_begin = 0;         // leaf columns under this node: [leaf_begin, leaf_end)
  int leaf_end = 0;
  bool is_list = false;         // LIST group: its one (repeated) child's items are the array
  bool is_map = false;          // MAP group: its repeated key_value child becomes an object
  bool unwrap_element = false;  // repeated node of a 3-level LIST: the item is its only child
  bool is_leaf() const { return children.empty(); }
};

struct Schema {
  std::vector<SchemaNode> nodes;  // nodes[0] is the root
  std::vector<int> leaves;        // node index of each leaf column, in file order
};

// Builds the tree from the footer's flattened schema; Error naming `file` and
// the field for a malformed schema (bad child counts, empty groups, a LIST
// without a repeated child, nesting too deep).
Schema build_schema(const std::vector<SchemaElement>& elements, const std::string& file);

}  // namespace lockstep::data::parquet
