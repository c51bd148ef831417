// The parts of parquet's footer (FileMetaData) and page headers that a row
// reader needs, decoded from Thrift compact bytes. Field ids and enum values
// follow parquet-format's parquet.thrift.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data::parquet {

enum PhysicalType : int32_t {
  kBoolean = 0,
  kInt32 = 1,
  kInt64 = 2,
  kInt96 = 3,
  kFloat = 4,
  kDouble = 5,
  kByteArray = 6,
  kFixedLenByteArray = 7,
};

enum Repetition : int32_t { kRequired = 0, kOptional = 1, kRepeated = 2 };

enum Encoding : int32_t {
  kPlain = 0,
  kPlainDictionary = 2,
  kRle = 3,
  kBitPacked = 4,
  kRleDictionary = 8,
};

enum Codec : int32_t { kUncompressed = 0, kSnappy = 1, kGzip = 2, kZstd = 6 };

enum PageType : int32_t { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };

// ConvertedType values the reader acts on.
enum ConvertedType : int32_t { kMap = 1, kMapKeyValue = 2, kList = 3, kUint32 = 14, kUint64 = 15 };

// LogicalType union members (field ids) the reader acts on.
enum LogicalType : int32_t { kLogicalMap = 2, kLogicalList = 3, kLogicalInteger = 10 };

struct SchemaElement {
  std::string name;
  int32_t type = -1;  // PhysicalType; -1 for a group
  int32_t type_length = 0;
  int32_t repetition = kRequired;
  int32_t num_children = 0;
  int32_t converted_type = -1;
  int32_t logical_type = -1;      // the LogicalType union member set, if any
  bool logical_unsigned = false;  // INTEGER(signed = false)
};

struct ColumnMeta {
  int32_t type = -1;
  std::vector<std::string> path;
  int32_t codec = kUncompressed;
  int64_t num_values = 0;
  int64_t total_compressed_size = 0;
  int64_t data_page_offset = -1;
  int64_t dictionary_page_offset = -1;
};

struct RowGroup {
  int64_t num_rows = 0;
  std::vector<ColumnMeta> columns;
};

struct FileMeta {
  std::vector<SchemaElement> schema;
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
};

struct PageHeader {
  int32_t type = -1;
  int32_t uncompressed_size = 0;
  int32_t compressed_size = 0;
  int32_t num_values = 0;
  int32_t encoding = kPlain;
  int32_t def_encoding = kRle;  // data page v1
  int32_t rep_encoding = kRle;  // data page v1
  int32_t def_bytes = 0;        // data page v2
  int32_t rep_bytes = 0;        // data page v2
  bool is_compressed = true;    // data page v2
  size_t header_size = 0;       // bytes the header itself took
};

// Errors name `context` (the file) and the byte offset of the problem.
FileMeta parse_file_meta(const uint8_t* data, size_t size, const std::string& context);
PageHeader parse_page_header(const uint8_t* data, size_t size, const std::string& context);

const char* encoding_name(int32_t encoding);
const char* codec_name(int32_t codec);

}  // namespace lockstep::data::parquet
