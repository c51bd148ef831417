// Codecs through the system libraries: libsnappy, zlib (gzip or zlib
// framing), libzstd.
#include "lockstep/data/parquet_codec.h"

#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include "lockstep/base/error.h"
#include "lockstep/data/parquet_format.h"

namespace lockstep::data::parquet {

namespace {

std::string inflate_gzip(const uint8_t* data, size_t size, size_t want) {
  std::string out(want, '\0');
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK)
    LS_THROW << "GZIP: cannot initialise zlib";  // 15+32: gzip or zlib header
  zs.next_in = const_cast<Bytef*>(data);
  zs.avail_in = static_cast<uInt>(size);
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(want);
  const int rc = inflate(&zs, Z_FINISH);
  const size_t produced = want - zs.avail_out;
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) LS_THROW << "GZIP: corrupt data (zlib error " << rc << ")";
  if (produced != want) LS_THROW << "GZIP: " << produced << " bytes, the page header says " << want;
  return out;
}

std::string unsnappy(const uint8_t* data, size_t size, size_t want) {
  size_t n = 0;
  const char* in = reinterpret_cast<const char*>(data);
  if (snappy_uncompressed_length(in, size, &n) != SNAPPY_OK) LS_THROW << "SNAPPY: corrupt data";
  if (n != want) LS_THROW << "SNAPPY: " << n << " bytes, the page header says " << want;
  std::string out(want, '\0');
  if (snappy_uncompress(in, size, out.data(), &n) != SNAPPY_OK || n != want)
    LS_THROW << "SNAPPY: corrupt data";
  return out;
}

std::string unzstd(const uint8_t* data, size_t size, size_t want) {
  std::string out(want, '\0');
  const size_t n = ZSTD_decompress(out.data(), want, data, size);
  if (ZSTD_isError(n)) LS_THROW << "ZSTD: corrupt data (" << ZSTD_getErrorName(n) << ")";
  if (n != want) LS_THROW << "ZSTD: " << n << " bytes, the page header says " << want;
  return out;
}

}  // namespace

size_t max_uncompressed_size(size_t compressed) {
  return compressed * 2048 + (size_t(1) << 20);
}

std::string decompress(int32_t codec, const uint8_t* data, size_t size, size_t uncompressed_size) {
  if (codec != kUncompressed && uncompressed_size > max_uncompressed_size(size))
    LS_THROW << codec_name(codec) << ": page claims " << uncompressed_size << " bytes from " << size
             << " compressed, beyond any real ratio";
  switch (codec) {
    case kUncompressed:
      if (size != uncompressed_size)
        LS_THROW << "uncompressed page of " << size << " bytes, the page header says " << uncompressed_size;
      return {reinterpret_cast<const char*>(data), size};
    case kSnappy: return unsnappy(data, size, uncompressed_size);
    case kGzip: return inflate_gzip(data, size, uncompressed_size);
    case kZstd: return unzstd(data, size, uncompressed_size);
    default:
      LS_THROW << "unsupported compression codec " << codec_name(codec) << " (" << codec
               << "); lockstep reads UNCOMPRESSED, SNAPPY, GZIP and ZSTD";
  }
}

}  // namespace lockstep::data::parquet
