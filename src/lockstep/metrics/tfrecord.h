// TFRecord framing, the container of TensorBoard event files: each record is
// its length (uint64, little-endian), the masked CRC32C of those 8 bytes, the
// payload, and the masked CRC32C of the payload.
#pragma once

#include <string>
#include <string_view>

namespace lockstep::metrics {

// One framed record holding `payload` (12 + payload.size() + 4 bytes).
std::string tfrecord_frame(std::string_view payload);

}  // namespace lockstep::metrics
