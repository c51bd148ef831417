// Page decompression for parquet: UNCOMPRESSED, SNAPPY, GZIP and ZSTD. The
// size a page header claims is checked against what the codec produces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep::data::parquet {

// Decompresses [data, data + size) with `codec` into exactly
// `uncompressed_size` bytes; an Error (without file context) names the codec
// when the data is corrupt or its size differs.
std::string decompress(int32_t codec, const uint8_t* data, size_t size, size_t uncompressed_size);

// The largest uncompressed size believed for `compressed` bytes: far above any
// codec's real ratio on page-sized data, low enough that a corrupt header
// cannot make the reader allocate gigabytes.
size_t max_uncompressed_size(size_t compressed);

}  // namespace lockstep::data::parquet
