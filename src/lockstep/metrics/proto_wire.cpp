// ProtoWriter (see proto_wire.h): base-128 varints and little-endian fixed
// widths, whatever the host's byte order.
#include "lockstep/metrics/proto_wire.h"

#include <cstring>

namespace lockstep::metrics {
namespace {

constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

}  // namespace

void ProtoWriter::varint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(char(uint8_t(v) | 0x80u));
    v >>= 7;
  }
  out_.push_back(char(uint8_t(v)));
}

void ProtoWriter::key(int field, int wire_type) {
  varint((uint64_t(field) << 3) | uint64_t(wire_type));
}

void ProtoWriter::fixed(uint64_t v, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i) out_.push_back(char(uint8_t(v >> (8 * i))));
}

void ProtoWriter::field_varint(int field, uint64_t v) {
  key(field, kVarint);
  varint(v);
}

void ProtoWriter::field_double(int field, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  key(field, kFixed64);
  fixed(bits, 8);
}

void ProtoWriter::field_float(int field, float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  key(field, kFixed32);
  fixed(bits, 4);
}

void ProtoWriter::field_bytes(int field, std::string_view bytes) {
  key(field, kLengthDelimited);
  varint(bytes.size());
  out_.append(bytes.data(), bytes.size());
}

}  // namespace lockstep::metrics
