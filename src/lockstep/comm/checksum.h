// 64-bit checksum of a byte range (the XXH64 algorithm, seed 0): fast enough
// (several GB/s) to verify every bucket of a weight broadcast on receipt.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::comm {

uint64_t checksum64(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace lockstep::comm
