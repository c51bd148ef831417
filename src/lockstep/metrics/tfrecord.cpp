// TFRecord framing (see tfrecord.h).
#include "lockstep/metrics/tfrecord.h"

#include <cstdint>

#include "lockstep/metrics/crc32c.h"

namespace lockstep::metrics {
namespace {

void put_le(std::string& out, uint64_t v, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i) out.push_back(char(uint8_t(v >> (8 * i))));
}

}  // namespace

std::string tfrecord_frame(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_le(out, payload.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(payload.data(), payload.size());
  put_le(out, masked_crc32c(payload), 4);
  return out;
}

}  // namespace lockstep::metrics
