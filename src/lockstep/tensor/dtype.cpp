// Scalar conversions for fp8 e4m3fn and bulk helpers for all types.
#include "lockstep/tensor/dtype.h"

#include <cmath>

#include "lockstep/base/error.h"

namespace lockstep {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::FP8E4M3: return 1;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::FP8E4M3: return "fp8_e4m3";
    case DType::I32: return "i32";
  }
  return "?";
}

float fp8_to_f32(fp8_t v) {
  const uint32_t sign = (v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t man = v & 0x7u;
  if (exp == 0xF && man == 0x7) return bits_f32(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    // Subnormal: man * 2^-9 (bias 7, 3 mantissa bits), exact in f32.
    const float mag = static_cast<float>(man) * 0.001953125f;
    return sign ? -mag : mag;
  }
  return bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

fp8_t f32_to_fp8(float f, bool saturate) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<fp8_t>(sign | 0x7f);  // NaN
  // Largest finite e4m3 is 448 = 1.75 * 2^8. Values >= 464 (the midpoint to the
  // next, non-existent, step 480) round beyond it; 464 itself ties to even, to 448.
  if (mag > f32_bits(464.0f)) return static_cast<fp8_t>(sign | (saturate ? 0x7e : 0x7f));
  const uint32_t exp = mag >> 23;  // biased f32 exponent
  if (exp < 121) {
    // Result is subnormal (or zero) in e4m3: quantum 2^-9. Round mag / 2^-9 to
    // nearest even; f32 arithmetic is exact here since the value is < 2^-6.
    const float scaled = bits_f32(mag) * 512.0f;
    float r = std::nearbyint(scaled);  // default rounding mode: ties to even
    const uint32_t q = static_cast<uint32_t>(r);  // 0..8; 8 means the smallest normal
    return static_cast<fp8_t>(sign | q);
  }
  // Normal: keep 3 mantissa bits, round to nearest even on the 20 dropped bits.
  uint32_t m = mag;
  const uint32_t lsb = (m >> 20) & 1u;
  m += 0x7ffffu + lsb;
  const uint32_t e8 = (m >> 23) - 120u;
  const uint32_t man = (m >> 20) & 0x7u;
  if (e8 > 15 || (e8 == 15 && man == 7)) return static_cast<fp8_t>(sign | (saturate ? 0x7e : 0x7f));
  return static_cast<fp8_t>(sign | (e8 << 3) | man);
}

void convert_f32_to_bf16(const float* src, bf16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
void convert_bf16_to_f32(const bf16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void convert_f32_to_fp8(const float* src, fp8_t* dst, size_t n, float scale, bool saturate) {
  LS_CHECK(scale > 0.0f && std::isfinite(scale)) << "fp8 scale must be positive and finite, got " << scale;
  const float inv = 1.0f / scale;
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_fp8(src[i] * inv, saturate);
}
void convert_fp8_to_f32(const fp8_t* src, float* dst, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) dst[i] = fp8_to_f32(src[i]) * scale;
}

}  // namespace lockstep
