// Philox4x32-10 and helpers; constants from the Random123 paper.
#include "lockstep/base/rng.h"

#include <cmath>

#include "lockstep/base/philox.h"

namespace lockstep {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  philox::rounds10(c.data(), k[0], k[1]);  // the device code's rounds (base/philox.h)
  return c;
}

float Philox::normal(uint64_t stream, uint64_t counter) const {
  auto b = block(stream, counter);
  // u1 in (0, 1] so log(u1) is finite.
  const double u1 = (static_cast<double>(b[0]) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = static_cast<double>(b[1]) * (1.0 / 4294967296.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace lockstep
