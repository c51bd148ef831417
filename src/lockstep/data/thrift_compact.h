// A reader of Thrift's compact protocol, the encoding of a parquet file's
// footer and page headers. Every length and count is checked against the bytes
// left, so a corrupt footer is an Error, never a huge allocation or a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace lockstep::data {

// Compact-protocol type codes (as they appear in field and list headers).
enum class ThriftType : uint8_t {
  kStop = 0,
  kBoolTrue = 1,
  kBoolFalse = 2,
  kByte = 3,
  kI16 = 4,
  kI32 = 5,
  kI64 = 6,
  kDouble = 7,
  kBinary = 8,
  kList = 9,
  kSet = 10,
  kMap = 11,
  kStruct = 12,
};

struct ThriftListHeader {
  ThriftType elem_type = ThriftType::kStop;
  int64_t size = 0;
};

// Reads from [data, data + size). Errors read "<context>: <problem> at byte N".
class ThriftReader {
 public:
  ThriftReader(const uint8_t* data, size_t size, std::string context);

  size_t pos() const { return pos_; }

  // Calls on_field(id, type) for each field of the struct at the cursor; the
  // callback must consume the value (a read_* call or skip(type)).
  void read_struct(const std::function<void(int16_t id, ThriftType type)>& on_field);

  // A field's boolean lives in its type code; a list element's in a byte.
  static bool field_bool(ThriftType type) { return type == ThriftType::kBoolTrue; }
  bool read_list_bool();
  int32_t read_i32();
  int64_t read_i64();
  double read_double();
  std::string read_binary();
  ThriftListHeader read_list_header();
  void skip(ThriftType type);

  [[noreturn]] void fail(const std::string& what) const;

 private:
  uint8_t read_byte();
  uint64_t read_varint();
  int64_t read_zigzag() {
    const uint64_t v = read_varint();
    return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
  }
  void skip_depth(ThriftType type, int depth);
  void skip_element(ThriftType type, int depth);

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  int struct_depth_ = 0;
  std::string context_;
};

}  // namespace lockstep::data
