// Exact, order-free sums of f32 values: every term is rounded once onto a
// fixed-point grid (signed 128-bit integers whose unit is 2^-80), the terms
// are added as integers, and the total is rounded once back to f32. Integer
// addition is associative and commutative, so the total has the same bits
// whatever the order and grouping of the additions: on one rank or over P
// ranks ([dist] world_invariant, docs/distributed.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::comm {

// Two's complement, unit 2^-kFixedFractionBits. Additions wrap (they are done
// on the unsigned type), so intermediate sums may leave the range as long as
// the final one is inside it: the result is the exact sum modulo 2^128.
using Fixed = __int128;

inline constexpr int kFixedFractionBits = 80;
// A term must be below 2^kFixedTermBits in magnitude (its fixed value below
// 2^112) ...
inline constexpr int kFixedTermBits = 32;
// ... and a sum must have at most kFixedMaxTerms terms per element: then the
// true sum is below 2^15 * 2^112 = 2^127 and the wrapped integer is exact.
inline constexpr int64_t kFixedMaxTerms = int64_t(1) << 15;

// x rounded to the nearest multiple of 2^-80 (ties to even), as a Fixed.
// Returns false, leaving *out untouched, when x is not finite or
// |x| >= 2^kFixedTermBits.
bool to_fixed(float x, Fixed* out);

// The value of a Fixed rounded to the nearest f32 (ties to even): one
// rounding, exact for any Fixed.
float fixed_to_float(Fixed v);
// The same to the nearest double.
double fixed_to_double(Fixed v);

inline Fixed fixed_add(Fixed a, Fixed b) {
  return Fixed(static_cast<unsigned __int128>(a) + static_cast<unsigned __int128>(b));
}

// acc[i] += to_fixed(g[i]) for i in [0, n) (first: acc[i] = to_fixed(g[i]),
// whatever acc held, which saves a pass zeroing it), then g[i] = 0. Returns
// the number of terms to_fixed refused (non-finite or too large); they add nothing.
int64_t fold_into(float* g, Fixed* acc, size_t n, bool first = false);
// out[i] = fixed_to_float(acc[i]) for i in [0, n).
void unfold_into(const Fixed* acc, float* out, size_t n);

}  // namespace lockstep::comm
