// RLE / bit-packed hybrid decoding: a varint header per run; odd headers are
// groups of 8 bit-packed values (LSB first), even ones a repeated value.
#include "lockstep/data/rle_hybrid.h"

#include "lockstep/base/error.h"

namespace lockstep::data::parquet {

namespace {

uint64_t read_varint(const uint8_t* data, size_t size, size_t* pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= size) LS_THROW << "RLE run header past the end of its data";
    const uint8_t b = data[(*pos)++];
    v |= uint64_t(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  LS_THROW << "RLE run header longer than 10 bytes";
}

uint32_t unpack(const uint8_t* bytes, size_t bit, int bit_width) {
  uint64_t v = 0;
  for (int i = 0; i < bit_width; ++i, ++bit) v |= uint64_t((bytes[bit >> 3] >> (bit & 7)) & 1) << i;
  return static_cast<uint32_t>(v);
}

}  // namespace

int bit_width_for(uint32_t max_value) {
  int w = 0;
  while (max_value != 0) {
    ++w;
    max_value >>= 1;
  }
  return w;
}

void decode_rle_hybrid(const uint8_t* data, size_t size, int bit_width, size_t count,
                       std::vector<uint32_t>* out) {
  if (bit_width < 0 || bit_width > 32) LS_THROW << "bit width " << bit_width << " out of range 0..32";
  out->assign(count, 0);
  size_t pos = 0, n = 0;
  while (n < count) {
    const uint64_t header = read_varint(data, size, &pos);
    if (header & 1) {
      const uint64_t groups = header >> 1;
      const uint64_t bytes = groups * uint64_t(bit_width);  // 8 values of bit_width bits per group
      if (groups > size || bytes > size - pos)
        LS_THROW << "bit-packed run of " << groups << " groups past the end";
      const uint64_t values = groups * 8;
      for (uint64_t i = 0; i < values && n < count; ++i)
        (*out)[n++] = unpack(data + pos, i * bit_width, bit_width);
      pos += bytes;
    } else {
      const uint64_t run = header >> 1;
      const size_t width_bytes = (size_t(bit_width) + 7) / 8;
      if (width_bytes > size - pos) LS_THROW << "RLE run value past the end";
      uint32_t v = 0;
      for (size_t i = 0; i < width_bytes; ++i) v |= uint32_t(data[pos + i]) << (8 * i);
      pos += width_bytes;
      if (run == 0) LS_THROW << "RLE run of length 0";
      for (uint64_t i = 0; i < run && n < count; ++i) (*out)[n++] = v;
    }
  }
}

}  // namespace lockstep::data::parquet
