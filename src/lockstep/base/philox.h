// Philox4x32-10 (Salmon et al. 2011) as inline integer code that also compiles
// as CUDA/HIP device code, so a GPU kernel draws the same bits as base/rng.h's
// Philox (which is this function). Only integer operations: no float at all.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define LS_PHILOX_HD __host__ __device__
#else
#define LS_PHILOX_HD
#endif

namespace lockstep::philox {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

// Ten rounds on the counter c[4] with the key (k0, k1); the result replaces c.
LS_PHILOX_HD inline void rounds10(uint32_t* c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
}

// The first two words of the block at (stream, counter) under key `seed`, as
// Philox::u64: the 128-bit counter is (counter lo, counter hi, stream lo,
// stream hi), the key (seed lo, seed hi).
LS_PHILOX_HD inline uint64_t u64(uint64_t seed, uint64_t stream, uint64_t counter) {
  uint32_t c[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                   static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
  rounds10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(c[1]) << 32) | c[0];
}

// The 53 random bits of Philox::uniform_double: u = bits53 * 2^-53 in [0, 1).
LS_PHILOX_HD inline uint64_t bits53(uint64_t seed, uint64_t stream, uint64_t counter) {
  return u64(seed, stream, counter) >> 11;
}

}  // namespace lockstep::philox
