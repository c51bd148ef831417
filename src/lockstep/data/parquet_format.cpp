// Decoding of parquet's Thrift structures: FileMetaData (schema, row groups,
// column chunks) and PageHeader. Unknown fields are skipped, as Thrift allows.
#include "lockstep/data/parquet_format.h"

#include "lockstep/data/thrift_compact.h"

namespace lockstep::data::parquet {

namespace {

using T = ThriftType;

void read_logical_type(ThriftReader& r, SchemaElement* e) {
  r.read_struct([&](int16_t id, T t) {
    e->logical_type = id;
    if (id != kLogicalInteger || t != T::kStruct) return r.skip(t);
    r.read_struct([&](int16_t iid, T it) {
      if (iid == 2 && (it == T::kBoolTrue || it == T::kBoolFalse)) {
        e->logical_unsigned = !ThriftReader::field_bool(it);
      } else {
        r.skip(it);
      }
    });
  });
}

SchemaElement read_schema_element(ThriftReader& r) {
  SchemaElement e;
  r.read_struct([&](int16_t id, T t) {
    if (id == 1 && t == T::kI32) {
      e.type = r.read_i32();
    } else if (id == 2 && t == T::kI32) {
      e.type_length = r.read_i32();
    } else if (id == 3 && t == T::kI32) {
      e.repetition = r.read_i32();
    } else if (id == 4 && t == T::kBinary) {
      e.name = r.read_binary();
    } else if (id == 5 && t == T::kI32) {
      e.num_children = r.read_i32();
    } else if (id == 6 && t == T::kI32) {
      e.converted_type = r.read_i32();
    } else if (id == 10 && t == T::kStruct) {
      read_logical_type(r, &e);
    } else {
      r.skip(t);
    }
  });
  return e;
}

template <typename Fn>
void read_list(ThriftReader& r, T field_type, T want, Fn&& each) {
  if (field_type != T::kList) r.fail("expected a list");
  const ThriftListHeader h = r.read_list_header();
  if (h.elem_type != want) r.fail("unexpected list element type");
  for (int64_t i = 0; i < h.size; ++i) each();
}

ColumnMeta read_column_meta(ThriftReader& r) {
  ColumnMeta m;
  r.read_struct([&](int16_t id, T t) {
    if (id == 1 && t == T::kI32) {
      m.type = r.read_i32();
    } else if (id == 3) {
      read_list(r, t, T::kBinary, [&] { m.path.push_back(r.read_binary()); });
    } else if (id == 4 && t == T::kI32) {
      m.codec = r.read_i32();
    } else if (id == 5 && t == T::kI64) {
      m.num_values = r.read_i64();
    } else if (id == 7 && t == T::kI64) {
      m.total_compressed_size = r.read_i64();
    } else if (id == 9 && t == T::kI64) {
      m.data_page_offset = r.read_i64();
    } else if (id == 11 && t == T::kI64) {
      m.dictionary_page_offset = r.read_i64();
    } else {
      r.skip(t);
    }
  });
  return m;
}

RowGroup read_row_group(ThriftReader& r) {
  RowGroup g;
  r.read_struct([&](int16_t id, T t) {
    if (id == 1) {
      read_list(r, t, T::kStruct, [&] {
        bool has_meta = false;
        r.read_struct([&](int16_t cid, T ct) {
          if (cid == 3 && ct == T::kStruct) {
            g.columns.push_back(read_column_meta(r));
            has_meta = true;
          } else {
            r.skip(ct);
          }
        });
        if (!has_meta) r.fail("column chunk without metadata (external column files are not supported)");
      });
    } else if (id == 3 && t == T::kI64) {
      g.num_rows = r.read_i64();
    } else {
      r.skip(t);
    }
  });
  return g;
}

void read_data_page_header(ThriftReader& r, PageHeader* h) {
  r.read_struct([&](int16_t id, T t) {
    if (id == 1 && t == T::kI32) {
      h->num_values = r.read_i32();
    } else if (id == 2 && t == T::kI32) {
      h->encoding = r.read_i32();
    } else if (id == 3 && t == T::kI32) {
      h->def_encoding = r.read_i32();
    } else if (id == 4 && t == T::kI32) {
      h->rep_encoding = r.read_i32();
    } else {
      r.skip(t);
    }
  });
}

void read_data_page_header_v2(ThriftReader& r, PageHeader* h) {
  r.read_struct([&](int16_t id, T t) {
    if (id == 1 && t == T::kI32) {
      h->num_values = r.read_i32();
    } else if (id == 4 && t == T::kI32) {
      h->encoding = r.read_i32();
    } else if (id == 5 && t == T::kI32) {
      h->def_bytes = r.read_i32();
    } else if (id == 6 && t == T::kI32) {
      h->rep_bytes = r.read_i32();
    } else if (id == 7 && (t == T::kBoolTrue || t == T::kBoolFalse)) {
      h->is_compressed = ThriftReader::field_bool(t);
    } else {
      r.skip(t);
    }
  });
}

}  // namespace

FileMeta parse_file_meta(const uint8_t* data, size_t size, const std::string& context) {
  ThriftReader r(data, size, context + ": footer");
  FileMeta m;
  r.read_struct([&](int16_t id, T t) {
    if (id == 2) {
      read_list(r, t, T::kStruct, [&] { m.schema.push_back(read_schema_element(r)); });
    } else if (id == 3 && t == T::kI64) {
      m.num_rows = r.read_i64();
    } else if (id == 4) {
      read_list(r, t, T::kStruct, [&] { m.row_groups.push_back(read_row_group(r)); });
    } else {
      r.skip(t);
    }
  });
  return m;
}

PageHeader parse_page_header(const uint8_t* data, size_t size, const std::string& context) {
  ThriftReader r(data, size, context + ": page header");
  PageHeader h;
  r.read_struct([&](int16_t id, T t) {
    if (id == 1 && t == T::kI32) {
      h.type = r.read_i32();
    } else if (id == 2 && t == T::kI32) {
      h.uncompressed_size = r.read_i32();
    } else if (id == 3 && t == T::kI32) {
      h.compressed_size = r.read_i32();
    } else if ((id == 5 || id == 7) && t == T::kStruct) {  // data page v1, dictionary page
      read_data_page_header(r, &h);
    } else if (id == 8 && t == T::kStruct) {
      read_data_page_header_v2(r, &h);
    } else {
      r.skip(t);
    }
  });
  if (h.uncompressed_size < 0 || h.compressed_size < 0 || h.num_values < 0)
    r.fail("negative size in page header");
  h.header_size = r.pos();
  return h;
}

const char* encoding_name(int32_t encoding) {
  static constexpr const char* kNames[] = {
      "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
      "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  if (encoding < 0 || encoding >= int32_t(std::size(kNames))) return "unknown";
  return kNames[encoding];
}

const char* codec_name(int32_t codec) {
  static constexpr const char* kNames[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                           "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
  if (codec < 0 || codec >= int32_t(std::size(kNames))) return "unknown";
  return kNames[codec];
}

}  // namespace lockstep::data::parquet
