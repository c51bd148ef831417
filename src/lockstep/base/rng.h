// Counter-based RNG (Philox4x32-10, Salmon et al. 2011). A draw is a pure
// function of (seed, stream, counter): a sample's random numbers never depend
// on what else shares its batch or thread (docs/architecture.md section 4).
#pragma once

#include <array>
#include <cstdint>

namespace lockstep {

// One Philox4x32-10 block: 4 random 32-bit words from a 128-bit counter and 64-bit key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Keyed generator. `seed` is the key; `stream` and `counter` form the 128-bit
// counter (stream in the high 64 bits). Stateless: the same arguments give the same bits.
class Philox {
 public:
  explicit Philox(uint64_t seed) : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)} {}

  std::array<uint32_t, 4> block(uint64_t stream, uint64_t counter) const {
    return philox4x32({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                       static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                      key_);
  }
  uint32_t u32(uint64_t stream, uint64_t counter) const { return block(stream, counter)[0]; }
  uint64_t u64(uint64_t stream, uint64_t counter) const {
    auto b = block(stream, counter);
    return (static_cast<uint64_t>(b[1]) << 32) | b[0];
  }
  // Uniform in [0, 1) with 24 random bits (every value exactly representable).
  float uniform(uint64_t stream, uint64_t counter) const {
    return static_cast<float>(u32(stream, counter) >> 8) * (1.0f / 16777216.0f);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform_double(uint64_t stream, uint64_t counter) const {
    return static_cast<double>(u64(stream, counter) >> 11) * (1.0 / 9007199254740992.0);
  }
  // Standard normal by Box-Muller from two uniforms of the same block.
  float normal(uint64_t stream, uint64_t counter) const;

 private:
  std::array<uint32_t, 2> key_;
};

// Mixes several 64-bit values into one seed (splitmix64 finaliser), for
// deriving per-purpose streams: mix_seed(seed, sample, layer).
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace lockstep
