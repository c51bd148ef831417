// CRC32C (Castagnoli), the checksum of TFRecord framing, and the "masked"
// form TensorFlow stores so that a CRC of data holding CRCs stays strong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lockstep::metrics {

// CRC-32C of `data` (reflected polynomial 0x82F63B78, initial and final
// XOR 0xFFFFFFFF): crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data);

// TensorFlow's masked CRC: rotate right by 15 bits, add 0xA282EAD8.
uint32_t masked_crc32c(std::string_view data);

}  // namespace lockstep::metrics
