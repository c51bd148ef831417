// Element types and exact conversions between them. bf16 and fp8-e4m3 are
// stored as raw bits; conversions from f32 round to nearest, ties to even.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace lockstep {

enum class DType : uint8_t { F32, BF16, FP8E4M3, I32 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", "fp8_e4m3", "i32"

using bf16_t = uint16_t;  // raw bfloat16 bits
using fp8_t = uint8_t;    // raw float8 e4m3fn bits (OCP: no inf, NaN = S.1111.111, max 448)

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 -> f32 is exact.
inline float bf16_to_f32(bf16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// f32 -> bf16, round to nearest even; NaN stays NaN (quiet), inf stays inf.
inline bf16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // overflow past the largest finite rounds to inf, as IEEE says
  return static_cast<bf16_t>(u >> 16);
}

// Rounds an f32 to the nearest bf16 value and back (what a bf16 store loses).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// fp8 e4m3fn -> f32 is exact.
float fp8_to_f32(fp8_t v);

// f32 -> fp8 e4m3fn, round to nearest even. NaN -> NaN. Magnitudes that round
// above 448 (inf included) give NaN when saturate is false (the OCP/PyTorch
// cast), or +-448 when saturate is true (what scaled quantization wants).
fp8_t f32_to_fp8(float f, bool saturate = false);

constexpr float kFp8E4M3Max = 448.0f;

// Bulk conversions (n elements).
void convert_f32_to_bf16(const float* src, bf16_t* dst, size_t n);
void convert_bf16_to_f32(const bf16_t* src, float* dst, size_t n);
void convert_f32_to_fp8(const float* src, fp8_t* dst, size_t n, float scale, bool saturate);  // dst = fp8(src / scale)
void convert_fp8_to_f32(const fp8_t* src, float* dst, size_t n, float scale);                 // dst = f32(src) * scale

}  // namespace lockstep
