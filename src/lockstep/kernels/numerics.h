// Scalar numerics shared by the CPU kernels and the GPU kernels (host and device):
// exp/log/sigmoid/silu with the bits of kernels::vexp/vlog/vsigmoid/vsilu (Highway
// 1.0.3's AVX2 polynomials, step for step), bf16/fp8 conversions, and the 16-lane tree.
#pragma once

#include <cstdint>

#include "lockstep/kernels/gpu/float_ops.h"

namespace lockstep::num {

using gpu::ls_add;
using gpu::ls_div;
using gpu::ls_fma;
using gpu::ls_mul;
using gpu::ls_sub;

// Bit casts that compile as device code too (no memcpy, no unions).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
LS_HD inline uint32_t bits(float f) { return __float_as_uint(f); }
LS_HD inline float from_bits(uint32_t u) { return __uint_as_float(u); }
#else
LS_HD inline uint32_t bits(float f) { return __builtin_bit_cast(uint32_t, f); }
LS_HD inline float from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }
#endif

LS_HD inline bool is_nan(float f) { return (bits(f) & 0x7fffffffu) > 0x7f800000u; }
// Highway's Neg: a sign flip (exact for zeros and NaN), not 0 - x.
LS_HD inline float neg(float f) { return from_bits(bits(f) ^ 0x80000000u); }

namespace detail {

// x86's "default NaN": what an invalid operation (inf / inf, 0 * inf) returns
// on the CPU. CUDA and HIP return 0x7fffffff there, so device code must not
// rely on the hardware for NaNs the CPU creates.
constexpr uint32_t kX86DefaultNan = 0xffc00000u;

// hn::Min(v, 89) on AVX2 is _mm256_min_ps(v, 89): (v < 89) ? v : 89, so the
// second operand (89) when v is NaN.
LS_HD inline float min89(float v) { return v < 89.0f ? v : 89.0f; }

// 2^e for an integer e in the normal range (Highway's Pow2I).
LS_HD inline float pow2i(int32_t e) { return from_bits(static_cast<uint32_t>(e + 0x7f) << 23); }

// Highway's ExpImpl<float>::ExpPoly: Estrin's scheme for c0..c5, then r + r^2 * p.
LS_HD inline float exp_poly(float r) {
  const float k0 = +0.5f;
  const float k1 = +0.166666671633720397949219f;
  const float k2 = +0.0416664853692054748535156f;
  const float k3 = +0.00833336077630519866943359f;
  const float k4 = +0.00139304355252534151077271f;
  const float k5 = +0.000198527617612853646278381f;
  const float r2 = ls_mul(r, r);
  const float r4 = ls_mul(r2, r2);
  const float est = ls_fma(r4, ls_fma(k5, r, k4), ls_fma(r2, ls_fma(k3, r, k2), ls_fma(k1, r, k0)));
  return ls_fma(est, ls_mul(r, r), r);
}

// Highway's Exp for a non-NaN x <= 89 (the project's clamp). Below -104 Highway
// returns +0 (IfThenElseZero(Ge(x, -104))); returning early there also keeps q
// in [-150, 128], so ConvertTo's overflow fix-up and Pow2I's wrap never matter.
LS_HD inline float exp_core(float x) {
  if (!(x >= -104.0f)) return 0.0f;
  // q = trunc(x / ln2 + copysign(0.5, x)), as ConvertTo (cvttps) truncates.
  const float half = from_bits(0x3f000000u | (bits(x) & 0x80000000u));
  const float qx = ls_fma(x, static_cast<float>(+1.442695040888963407359924681), half);
  const int32_t q = static_cast<int32_t>(qx);  // |qx| < 151: in range, truncation
  const float qf = static_cast<float>(q);      // exact
  // ExpReduce: x - q ln2 in two parts.
  float r = ls_fma(qf, -0.693145751953125f, x);
  r = ls_fma(qf, -1.428606765330187045e-6f, r);
  const float y = ls_add(exp_poly(r), 1.0f);
  // LoadExpShortRange: y * 2^(q>>1) * 2^(q - (q>>1)); >> is arithmetic (srai).
  const int32_t h = q >> 1;
  return ls_mul(ls_mul(y, pow2i(h)), pow2i(q - h));
}

// Highway's LogImpl<float>::LogPoly over z in about [-0.17, 0.17].
LS_HD inline float log_poly(float z) {
  const float k0 = 0.66666662693f;
  const float k1 = 0.40000972152f;
  const float k2 = 0.28498786688f;
  const float k3 = 0.24279078841f;
  const float z2 = ls_mul(z, z);
  const float z4 = ls_mul(z2, z2);
  return ls_fma(ls_fma(k2, z4, k0), z2, ls_mul(ls_fma(k3, z4, k1), z4));
}

// Highway's impl::Log<kAllowSubnormals = true> for a non-NaN x. It has no
// special cases: zeros, negatives and +-inf come out finite (log(0) ~ -103.3),
// and the CPU's bits are exactly that, so they are reproduced, not fixed.
LS_HD inline float log_core(float x) {
  const float kLn2Hi = 0.69313812256f;
  const float kLn2Lo = 9.0580006145e-6f;
  const uint32_t kMagic = 0x3f3504f3u;
  // Lt(x, FLT_MIN): true for subnormals, zeros and every negative x.
  const bool denormal = x < 1.175494351e-38f;
  if (denormal) x = ls_mul(x, 3.355443200e+7f);  // 2^25
  const uint32_t exp_bits = bits(x) + (0x3f800000u - kMagic);
  // Logical shift of the (possibly sign-carrying) bits, as Highway's ShiftRight on u32.
  const int32_t e = static_cast<int32_t>(exp_bits >> 23) - 0x7f + (denormal ? -25 : 0);
  const float ef = static_cast<float>(e);  // exact: |e| < 512
  const float y = from_bits((exp_bits & 0x7fffffu) + kMagic);
  const float ym1 = ls_sub(y, 1.0f);
  const float z = ls_div(ym1, ls_add(y, 1.0f));
  // MulSub(a, b, c) = fmsub = fma(a, b, -c), the same rounding and signed zeros.
  const float inner = ls_fma(z, ls_sub(ym1, log_poly(z)), neg(ls_mul(ef, kLn2Lo)));
  return ls_fma(ef, kLn2Hi, neg(ls_sub(inner, ym1)));
}

}  // namespace detail

// The CPU's map passes a NaN input through unchanged (same payload, same sign).
LS_HD inline float exp(float x) { return is_nan(x) ? x : detail::exp_core(detail::min89(x)); }

LS_HD inline float log(float x) { return is_nan(x) ? x : detail::log_core(x); }

// 1 / (1 + exp(-x)).
LS_HD inline float sigmoid(float x) {
  if (is_nan(x)) return x;
  return ls_div(1.0f, ls_add(1.0f, detail::exp_core(detail::min89(neg(x)))));
}

// x / (1 + exp(-x)) (the CPU divides; it does not multiply by sigmoid(x)).
LS_HD inline float silu(float x) {
  if (is_nan(x)) return x;
  // -inf / inf: the only NaN silu creates; give the CPU's NaN on every device.
  if (bits(x) == 0xff800000u) return from_bits(detail::kX86DefaultNan);
  return ls_div(x, ls_add(1.0f, detail::exp_core(detail::min89(neg(x)))));
}

// ---- bf16 (raw bits), as tensor/dtype.h ----

LS_HD inline float bf16_to_f32(uint16_t h) { return from_bits(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN (quieted, payload truncated), overflow rounds to inf.
LS_HD inline uint16_t f32_to_bf16(float f) {
  uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

// ---- fp8 e4m3fn (raw bits: no inf, NaN = S.1111.111, max 448), as tensor/dtype.cpp ----

// Exact decode; NaN gives sign | 0x7fc00000.
LS_HD inline float fp8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = (v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t man = v & 0x7u;
  if (exp == 0xf && man == 0x7) return from_bits(sign | 0x7fc00000u);
  if (exp == 0) {
    // Subnormal man * 2^-9, a normal f32: with the leading one of man moved to
    // bit 2, the value is 1.m * 2^(-7 - shift) (exact, no float math).
    if (man == 0) return from_bits(sign);
    uint32_t shift = 0;
    while (((man << shift) & 0x4u) == 0) ++shift;
    const uint32_t m = (man << shift) & 0x3u;  // the two bits below the leading one
    return from_bits(sign | ((120u - shift) << 23) | (m << 21));
  }
  return from_bits(sign | ((exp + 120u) << 23) | (man << 20));
}

// Round to nearest even. NaN -> NaN; magnitudes rounding above 448 (inf too)
// give NaN, or +-448 when saturate (the CPU's f32_to_fp8).
LS_HD inline uint8_t f32_to_fp8_e4m3(float f, bool saturate = false) {
  const uint32_t u = bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t mag = u & 0x7fffffffu;
  const uint8_t over = static_cast<uint8_t>(sign | (saturate ? 0x7e : 0x7f));
  if (mag > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);
  if (mag > 0x43e80000u) return over;  // 464.0f: the tie above 448 and beyond
  const uint32_t exp = mag >> 23;
  if (exp < 121) {
    // Subnormal (or zero) in e4m3, quantum 2^-9: q = rne(mag / 2^-9), done on
    // the significand (the CPU's nearbyint(mag * 512), which is exact there).
    const uint32_t sig = exp == 0 ? mag : (mag & 0x7fffffu) | 0x800000u;
    // mag / 2^-9 = sig / 2^shift (an f32 subnormal has the exponent of exp == 1).
    const uint32_t shift = 141u - (exp == 0 ? 1u : exp);  // >= 21
    if (shift > 25) return sign;  // below a quarter quantum: rounds to 0
    const uint32_t q = sig >> shift;
    const uint32_t rem = sig & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    const uint32_t up = (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
    return static_cast<uint8_t>(sign | (q + up));  // q + up == 8 is the smallest normal
  }
  uint32_t m = mag;
  const uint32_t lsb = (m >> 20) & 1u;
  m += 0x7ffffu + lsb;
  const uint32_t e8 = (m >> 23) - 120u;
  const uint32_t man = (m >> 20) & 0x7u;
  if (e8 > 15 || (e8 == 15 && man == 7)) return over;
  return static_cast<uint8_t>(sign | (e8 << 3) | man);
}

// The GEMM's widening (kernels/cpu/gemm_microkernel.h fp8_widen1): the byte,
// sign-extended and shifted into an f32 that is fp8 * 2^-120, times
// scale * 2^120: fp8_e4m3_to_f32(q) * scale rounded once. e4m3 NaN is never
// stored there (0x7f widens to 480 * scale, not NaN).
LS_HD inline float fp8_widen_scaled(uint8_t q, float scale120) {
  const uint32_t s = static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(q)));
  return ls_mul(from_bits((s << 20) & 0x87ffffffu), scale120);
}

// ---- the canonical reduction (kernels/cpu/simd.h) ----

constexpr int kLanes = 16;

// Combines 16 lane partials: lane j += lane j+8, then +4, +2, +1; the result is acc[0].
LS_HD inline float tree16(float* acc) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] = ls_add(acc[j], acc[j + w]);
  return acc[0];
}

// 16 partial sums: element i goes to lane i % 16, elements added in index order
// (canonical_sum with add, canonical_dot / canonical_sum_sq with fma).
struct Lanes16 {
  float lane[kLanes] = {};

  LS_HD void add(int64_t i, float x) { lane[i % kLanes] = ls_add(lane[i % kLanes], x); }
  LS_HD void fma(int64_t i, float a, float b) { lane[i % kLanes] = ls_fma(a, b, lane[i % kLanes]); }
  LS_HD float reduce() {
    float acc[kLanes];
    for (int j = 0; j < kLanes; ++j) acc[j] = lane[j];
    return tree16(acc);
  }
};

}  // namespace lockstep::num
