// Schema tree construction: walks the depth-first flattened schema, assigns
// levels (each OPTIONAL or REPEATED node adds a definition level, each
// REPEATED one a repetition level) and applies the LIST/MAP layout rules.
#include "lockstep/data/parquet_schema.h"

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"

namespace lockstep::data::parquet {

namespace {

// Levels are stored in bytes and records assembled recursively.
constexpr int kMaxDepth = 64;

struct Builder {
  const std::vector<SchemaElement>& elements;
  const std::string& file;
  Schema schema;
  size_t next = 0;

  [[noreturn]] void fail(const SchemaNode& n, const std::string& what) const {
    LS_THROW << file << ": schema field '" << excerpt(n.path) << "': " << what;
  }

  int add(int parent, int depth) {
    if (next >= elements.size()) LS_THROW << file << ": schema has fewer elements than its groups' children";
    if (depth > kMaxDepth) LS_THROW << file << ": schema nested deeper than " << kMaxDepth << " levels";
    const int index = int(schema.nodes.size());
    SchemaNode node;
    node.element = elements[next++];
    if (parent >= 0) {
      const SchemaNode& p = schema.nodes[parent];
      node.path = p.path.empty() ? node.element.name : p.path + "." + node.element.name;
      node.def_level = p.def_level + (node.element.repetition != kRequired ? 1 : 0);
      node.rep_level = p.rep_level + (node.element.repetition == kRepeated ? 1 : 0);
    }
    schema.nodes.push_back(node);
    const int32_t n_children = node.element.num_children;
    if (n_children < 0 || size_t(n_children) > elements.size() - next) fail(node, "bad number of children");
    schema.nodes[index].leaf_begin = int(schema.leaves.size());
    if (n_children == 0) {
      if (node.element.type < 0) fail(node, "group without fields");
      schema.leaves.push_back(index);
    }
    for (int32_t i = 0; i < n_children; ++i) {
      const int child = add(index, depth + 1);
      schema.nodes[index].children.push_back(child);
    }
    schema.nodes[index].leaf_end = int(schema.leaves.size());
    return index;
  }

  // LIST and MAP groups: the backward-compatibility rules of parquet-format's
  // LogicalTypes.md decide whether a list item is the repeated node or its child.
  void annotate(int index) {
    SchemaNode& n = schema.nodes[index];
    const int32_t ct = n.element.converted_type, lt = n.element.logical_type;
    const bool list = ct == kList || lt == kLogicalList;
    const bool map = ct == kMap || ct == kMapKeyValue || lt == kLogicalMap;
    if ((list || map) && !n.is_leaf()) {
      if (n.children.size() != 1 || schema.nodes[n.children[0]].element.repetition != kRepeated)
        fail(n, std::string(list ? "LIST" : "MAP") + " group needs exactly one repeated child");
      SchemaNode& r = schema.nodes[n.children[0]];
      if (list) {
        n.is_list = true;
        r.unwrap_element = !r.is_leaf() && r.children.size() == 1 && r.element.name != "array" &&
                           r.element.name != n.element.name + "_tuple";
      } else {
        if (r.children.size() != 2) fail(n, "MAP key_value group needs a key and a value field");
        n.is_map = true;
      }
    }
    for (int c : schema.nodes[index].children) annotate(c);
  }
};

}  // namespace

Schema build_schema(const std::vector<SchemaElement>& elements, const std::string& file) {
  if (elements.empty()) LS_THROW << file << ": empty schema";
  Builder b{elements, file, {}};
  b.add(-1, 0);
  if (b.next != elements.size()) LS_THROW << file << ": schema has elements outside its root";
  if (b.schema.nodes[0].is_leaf()) LS_THROW << file << ": schema root has no columns";
  b.annotate(0);
  return b.schema;
}

}  // namespace lockstep::data::parquet
