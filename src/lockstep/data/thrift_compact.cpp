// Thrift compact protocol: varints, zigzag integers, field headers with id
// deltas, list/map headers, and skipping of fields this reader does not use.
#include "lockstep/data/thrift_compact.h"

#include <cstring>

#include "lockstep/base/error.h"

namespace lockstep::data {

namespace {
// Nesting deeper than this is not a parquet footer (it nests a few levels).
constexpr int kMaxStructDepth = 64;
}  // namespace

ThriftReader::ThriftReader(const uint8_t* data, size_t size, std::string context)
    : data_(data), size_(size), context_(std::move(context)) {}

void ThriftReader::fail(const std::string& what) const {
  LS_THROW << context_ << ": " << what << " at byte " << pos_;
}

uint8_t ThriftReader::read_byte() {
  if (pos_ >= size_) fail("truncated thrift data");
  return data_[pos_++];
}

uint64_t ThriftReader::read_varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const uint8_t b = read_byte();
    v |= uint64_t(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  fail("varint longer than 10 bytes");
}

int32_t ThriftReader::read_i32() {
  const int64_t v = read_zigzag();
  if (v < INT32_MIN || v > INT32_MAX) fail("i32 out of range");
  return static_cast<int32_t>(v);
}

int64_t ThriftReader::read_i64() {
  return read_zigzag();
}

bool ThriftReader::read_list_bool() {
  return read_byte() == 1;
}

double ThriftReader::read_double() {
  if (size_ - pos_ < 8) fail("truncated double");
  double d = 0;
  std::memcpy(&d, data_ + pos_, 8);
  pos_ += 8;
  return d;
}

std::string ThriftReader::read_binary() {
  const uint64_t n = read_varint();
  if (n > size_ - pos_) fail("string length " + std::to_string(n) + " past the end");
  std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
  pos_ += n;
  return s;
}

ThriftListHeader ThriftReader::read_list_header() {
  const uint8_t b = read_byte();
  ThriftListHeader h;
  h.elem_type = static_cast<ThriftType>(b & 0x0f);
  uint64_t n = b >> 4;
  if (n == 15) n = read_varint();
  // Every element takes at least one byte, so more elements than bytes left
  // is corruption (and would make callers reserve absurd sizes).
  if (n > size_ - pos_) fail("list of " + std::to_string(n) + " elements past the end");
  h.size = static_cast<int64_t>(n);
  return h;
}

void ThriftReader::read_struct(const std::function<void(int16_t id, ThriftType type)>& on_field) {
  if (++struct_depth_ > kMaxStructDepth) fail("structs nested too deeply");
  int16_t last_id = 0;
  for (;;) {
    const uint8_t b = read_byte();
    const auto type = static_cast<ThriftType>(b & 0x0f);
    if (type == ThriftType::kStop) break;
    if (static_cast<uint8_t>(type) > static_cast<uint8_t>(ThriftType::kStruct))
      fail("bad field type " + std::to_string(b & 0x0f));
    const int delta = b >> 4;
    const int64_t id = delta != 0 ? last_id + delta : read_zigzag();
    if (id < INT16_MIN || id > INT16_MAX) fail("field id out of range");
    last_id = static_cast<int16_t>(id);
    on_field(last_id, type);
  }
  --struct_depth_;
}

void ThriftReader::skip(ThriftType type) {
  skip_depth(type, 0);
}

// Inside a list or map a bool is a whole byte, not part of a type code.
void ThriftReader::skip_element(ThriftType type, int depth) {
  if (type == ThriftType::kBoolTrue || type == ThriftType::kBoolFalse) {
    read_byte();
  } else {
    skip_depth(type, depth);
  }
}

void ThriftReader::skip_depth(ThriftType type, int depth) {
  if (depth > kMaxStructDepth) fail("values nested too deeply");
  switch (type) {
    case ThriftType::kBoolTrue:
    case ThriftType::kBoolFalse: return;
    case ThriftType::kByte: read_byte(); return;
    case ThriftType::kI16:
    case ThriftType::kI32:
    case ThriftType::kI64: read_varint(); return;
    case ThriftType::kDouble: read_double(); return;
    case ThriftType::kBinary: read_binary(); return;
    case ThriftType::kList:
    case ThriftType::kSet: {
      const ThriftListHeader h = read_list_header();
      for (int64_t i = 0; i < h.size; ++i) skip_element(h.elem_type, depth + 1);
      return;
    }
    case ThriftType::kMap: {
      const uint64_t n = read_varint();
      if (n == 0) return;
      if (n > size_ - pos_) fail("map of " + std::to_string(n) + " entries past the end");
      const uint8_t kv = read_byte();
      for (uint64_t i = 0; i < n; ++i) {
        skip_element(static_cast<ThriftType>(kv >> 4), depth + 1);
        skip_element(static_cast<ThriftType>(kv & 0x0f), depth + 1);
      }
      return;
    }
    case ThriftType::kStruct: read_struct([&](int16_t, ThriftType t) { skip_depth(t, depth + 1); }); return;
    default: fail("bad thrift type " + std::to_string(static_cast<int>(type)));
  }
}

}  // namespace lockstep::data
