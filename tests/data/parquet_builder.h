// Hand-built parquet files for tests: a Thrift compact-protocol writer and a
// one-column, one-page, one-row-group file around a page body the test lays
// out byte by byte (levels and values), so that layouts and faults no npm
// writer produces can be tested.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data::testing {

class ThriftWriter {
 public:
  std::string out;

  void i32(int16_t id, int64_t v) {
    field(id, 5);
    zigzag(v);
  }
  void i64(int16_t id, int64_t v) {
    field(id, 6);
    zigzag(v);
  }
  void binary(int16_t id, const std::string& s) {
    field(id, 8);
    varint(s.size());
    out += s;
  }
  void list(int16_t id, uint8_t elem_type, size_t n) {
    field(id, 9);
    if (n < 15) {
      out += char(n << 4 | elem_type);
    } else {
      out += char(0xf0 | elem_type);
      varint(n);
    }
  }
  void begin_struct(int16_t id) {
    field(id, 12);
    last_.push_back(0);
  }
  void begin_element() { last_.push_back(0); }  // a struct inside a list
  void end_struct() {
    out += '\0';
    last_.pop_back();
  }
  void list_i32(int64_t v) { zigzag(v); }
  void list_binary(const std::string& s) {
    varint(s.size());
    out += s;
  }

 private:
  void field(int16_t id, uint8_t type) {
    const int delta = id - last_.back();
    if (delta > 0 && delta <= 15) {
      out += char(delta << 4 | type);
    } else {
      out += char(type);
      zigzag(id);
    }
    last_.back() = id;
  }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out += char(v | 0x80);
      v >>= 7;
    }
    out += char(v);
  }
  void zigzag(int64_t v) { varint((uint64_t(v) << 1) ^ uint64_t(v >> 63)); }
  std::vector<int16_t> last_{0};
};

struct SchemaNodeSpec {
  std::string name;
  int type = -1;  // physical type, -1 for a group
  int repetition = 0;
  int num_children = 0;
  int converted_type = -1;
};

struct ColumnSpec {
  std::vector<SchemaNodeSpec> schema;  // after the root, depth first
  std::vector<std::string> path;       // the leaf's path
  int type = 1;
  int codec = 0;
  int encoding = 0;
  int64_t page_values = 0;    // entries in the page (levels)
  int64_t chunk_values = -1;  // the column chunk's claim (default: page_values)
  int64_t num_rows = 0;
  std::string body;  // v1 page body: rep levels, def levels, values
};

inline std::string build_parquet(const ColumnSpec& c) {
  ThriftWriter page;
  page.i32(1, 0);  // DATA_PAGE
  page.i32(2, int64_t(c.body.size()));
  page.i32(3, int64_t(c.body.size()));
  page.begin_struct(5);
  page.i32(1, c.page_values);
  page.i32(2, c.encoding);
  page.i32(3, 3);  // RLE levels
  page.i32(4, 3);
  page.end_struct();
  page.end_struct();
  const std::string chunk = page.out + c.body;

  ThriftWriter meta;
  meta.i32(1, 1);
  meta.list(2, 12, c.schema.size() + 1);
  meta.begin_element();
  meta.binary(4, "schema");
  meta.i32(5, 1);
  meta.end_struct();
  for (const auto& e : c.schema) {
    meta.begin_element();
    if (e.type >= 0) meta.i32(1, e.type);
    meta.i32(3, e.repetition);
    meta.binary(4, e.name);
    if (e.num_children > 0) meta.i32(5, e.num_children);
    if (e.converted_type >= 0) meta.i32(6, e.converted_type);
    meta.end_struct();
  }
  meta.i64(3, c.num_rows);
  meta.list(4, 12, 1);
  meta.begin_element();
  meta.list(1, 12, 1);
  meta.begin_element();
  meta.i64(2, 4);
  meta.begin_struct(3);
  meta.i32(1, c.type);
  meta.list(2, 5, 1);
  meta.list_i32(c.encoding);
  meta.list(3, 8, c.path.size());
  for (const auto& p : c.path) meta.list_binary(p);
  meta.i32(4, c.codec);
  meta.i64(5, c.chunk_values >= 0 ? c.chunk_values : c.page_values);
  meta.i64(6, int64_t(chunk.size()));
  meta.i64(7, int64_t(chunk.size()));
  meta.i64(9, 4);
  meta.end_struct();
  meta.end_struct();
  meta.i64(2, int64_t(chunk.size()));
  meta.i64(3, c.num_rows);
  meta.end_struct();
  meta.end_struct();

  const auto len = uint32_t(meta.out.size());
  std::string file = "PAR1" + chunk + meta.out;
  for (int i = 0; i < 4; ++i) file += char((len >> (8 * i)) & 0xff);
  return file + "PAR1";
}

}  // namespace lockstep::data::testing
