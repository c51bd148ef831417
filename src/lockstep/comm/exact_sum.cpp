// to_fixed, fixed_to_float / fixed_to_double and fold_into: integer
// arithmetic on the IEEE-754 fields, no floating-point rounding mode involved.
#include "lockstep/comm/exact_sum.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace lockstep::comm {

namespace {
using U128 = unsigned __int128;

// The f32 mantissa m (implicit bit included) and shift s with |x| = m * 2^s * 2^-80.
bool decompose(float x, uint32_t* m, int* s, bool* negative) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const int e = int((bits >> 23) & 0xff);
  if (e == 0xff || e - 127 >= kFixedTermBits) return false;  // Inf, NaN, or too large
  *negative = (bits >> 31) != 0;
  *m = bits & 0x7fffff;
  if (e != 0) *m |= 0x800000;
  // x = m * 2^(e - 150) (subnormals: e = 1 with no implicit bit).
  *s = (e == 0 ? 1 : e) - 150 + kFixedFractionBits;
  return true;
}

// m * 2^s rounded to an integer, ties to even.
U128 shift_round(uint32_t m, int s) {
  if (s >= 0) return U128(m) << s;
  const int r = -s;
  if (r > 25) return 0;  // m < 2^24 < half of 2^r: rounds to 0
  const uint32_t q = m >> r, rem = m & ((uint32_t(1) << r) - 1), half = uint32_t(1) << (r - 1);
  return U128(q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0));
}

// |v| rounded to `bits` significant bits, ties to even, as a floating-point value.
template <typename T>
T round_magnitude(U128 mag, int bits) {
  if (mag == 0) return T(0);
  const int width = 128 - (uint64_t(mag >> 64) != 0 ? std::countl_zero(uint64_t(mag >> 64))
                                                    : 64 + std::countl_zero(uint64_t(mag)));
  int exp = -kFixedFractionBits;
  if (width > bits) {
    const int drop = width - bits;
    const U128 q = mag >> drop, rem = mag & ((U128(1) << drop) - 1), half = U128(1) << (drop - 1);
    mag = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);  // may carry to 2^bits: still exact
    exp += drop;
  }
  // mag < 2^(bits + 1): exact in T; the scaling by a power of two is exact too
  // (the grid's smallest unit, 2^-80, is a normal number in f32 and double).
  return std::ldexp(T(uint64_t(mag)), exp);
}

template <typename T>
T fixed_to(Fixed v, int bits) {
  const bool negative = v < 0;
  const U128 mag = negative ? U128(0) - U128(v) : U128(v);
  const T r = round_magnitude<T>(mag, bits);
  return negative ? -r : r;
}
}  // namespace

bool to_fixed(float x, Fixed* out) {
  uint32_t m;
  int s;
  bool negative;
  if (!decompose(x, &m, &s, &negative)) return false;
  const U128 mag = shift_round(m, s);
  *out = negative ? Fixed(U128(0) - mag) : Fixed(mag);
  return true;
}

// The hardware's int64 -> f32 conversion (round to nearest even) on the top
// 63 bits of |v|, with a sticky bit standing for the bits below them, then
// an exact scaling by a power of two. A step converts every parameter's sum:
// rounding bit by bit in software cost more than the rest of the optimizer.
float fixed_to_float(Fixed v) {
  const bool negative = v < 0;
  const U128 mag = negative ? U128(0) - U128(v) : U128(v);
  const uint64_t hi = uint64_t(mag >> 64), lo = uint64_t(mag);
  // drop: bits shifted out below the 63 kept (0..64); hi | 1 keeps clz defined.
  const int drop = hi != 0 ? 65 - std::countl_zero(hi) : int(lo >> 63);
  uint64_t top, rest;
  if (drop == 0) {
    top = lo;
    rest = 0;
  } else if (drop == 64) {
    top = hi;
    rest = lo;
  } else {
    top = (hi << (64 - drop)) | (lo >> drop);
    rest = lo << (64 - drop);
  }
  top |= rest != 0 ? 1 : 0;  // sticky: below the rounding point, decides ties
  // top < 2^63: exact as int64; one rounding to f32. The scale 2^(drop - 80)
  // is a normal f32, and so is the product (|v| >= 2^-80).
  const float r = float(int64_t(top)) * std::bit_cast<float>(uint32_t(drop - kFixedFractionBits + 127) << 23);
  return negative ? -r : r;
}

double fixed_to_double(Fixed v) {
  return fixed_to<double>(v, 53);
}

void unfold_into(const Fixed* acc, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fixed_to_float(acc[i]);
}

int64_t fold_into(float* g, Fixed* acc, size_t n, bool first) {
  int64_t refused = 0;
  for (size_t i = 0; i < n; ++i) {
    Fixed t = 0;
    // +-0 adds nothing (and stays 0); a refused term adds nothing either.
    if ((std::bit_cast<uint32_t>(g[i]) & 0x7fffffffu) != 0 && !to_fixed(g[i], &t)) ++refused;
    acc[i] = first ? t : fixed_add(acc[i], t);
    g[i] = 0.0f;
  }
  return refused;
}

}  // namespace lockstep::comm
