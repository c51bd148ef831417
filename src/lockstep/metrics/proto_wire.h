// The protocol-buffer wire format, write side only, for the few message
// fields TensorBoard event files need (varint, 64/32-bit, length-delimited).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::metrics {

// Appends fields to one serialized message; a sub-message is a ProtoWriter's
// bytes passed to field_bytes.
class ProtoWriter {
 public:
  void field_varint(int field, uint64_t v);             // int64 (two's complement), enum, bool
  void field_double(int field, double v);               // wire type 1, little-endian
  void field_float(int field, float v);                 // wire type 5, little-endian
  void field_bytes(int field, std::string_view bytes);  // string, bytes, sub-message
  const std::string& bytes() const { return out_; }

 private:
  void varint(uint64_t v);
  void key(int field, int wire_type);
  void fixed(uint64_t v, int n_bytes);

  std::string out_;
};

}  // namespace lockstep::metrics
