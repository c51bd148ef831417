// parquet's RLE / bit-packed hybrid encoding: repetition and definition
// levels, dictionary indices and RLE booleans. Input bounds are checked; a
// short or malformed stream is an Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep::data::parquet {

// Decodes `count` values of `bit_width` (0..32) bits from [data, data + size)
// into *out (resized to count). Throws Error (without file context) when the
// stream ends early or a run is malformed.
void decode_rle_hybrid(const uint8_t* data, size_t size, int bit_width, size_t count,
                       std::vector<uint32_t>* out);

// Bits needed for values up to max_value (0 for 0).
int bit_width_for(uint32_t max_value);

}  // namespace lockstep::data::parquet
