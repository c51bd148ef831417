// Power-of-two FP8 scales and the per-token, per-group activation quantizer.
#include "lockstep/kernels/cpu/fp8_quant.h"

#include <algorithm>
#include <cmath>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::kernels {

float fp8_pow2_scale(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  // frexp gives amax / 448 = m * 2^e with m in [0.5, 1): 2^e is the first
  // power of two at or above it, 2^(e-1) when m is exactly 0.5. The checks
  // below make the rule exact whatever rounding the division did.
  int e = 0;
  std::frexp(amax / kFp8E4M3Max, &e);
  float s = std::ldexp(1.0f, e);
  while (amax / s > kFp8E4M3Max) s *= 2.0f;
  while (amax / (s * 0.5f) <= kFp8E4M3Max) s *= 0.5f;
  return s;
}

Fp8BlockScale fp8_block_scale(float amax) {
  const float s = std::max(fp8_pow2_scale(amax), kFp8MinBlockScale);
  // Rounding is monotone in |x|, so the block's largest code is amax's.
  const float qmax = fp8_to_f32(f32_to_fp8(amax / s, /*saturate=*/true));
  if (qmax == 0.0f || qmax > 224.0f || s == kFp8MinBlockScale) return {s, false};
  return {s * 0.5f, true};
}

fp8_t fp8_block_code(float w, Fp8BlockScale b) {
  // w / s is exact (s is a power of two) unless it falls below f32's normal
  // range, far under e4m3's smallest step, where it rounds to 0.
  const fp8_t q = f32_to_fp8(w / (b.doubled ? b.scale * 2.0f : b.scale), /*saturate=*/true);
  // Doubling is exact in e4m3 up to 448 (subnormal codes included).
  return b.doubled ? f32_to_fp8(fp8_to_f32(q) * 2.0f) : q;
}

namespace {

constexpr float kE2M1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// The smallest power of two s with amax / s <= 6. With amax = m * 2^e,
// m in [0.5, 1): m * 2^3 <= 6 iff m <= 0.75, else m * 2^2 < 4 always fits.
float e2m1_pow2_scale(float amax) {
  if (!(amax > 0.0f)) return 1.0f;
  int e = 0;
  const float m = std::frexp(amax, &e);
  return std::ldexp(1.0f, m <= 0.75f ? e - 3 : e - 2);
}

}  // namespace

float e2m1_value(uint8_t nibble) {
  const float mag = kE2M1Values[nibble & 7u];
  return (nibble & 8u) ? -mag : mag;
}

uint8_t e2m1_code(float v) {
  const float a = std::fabs(v);
  // Midpoints between neighbours; at a tie the even code (mantissa bit 0) wins.
  const uint8_t code = a <= 0.25f   ? 0
                       : a < 0.75f  ? 1
                       : a <= 1.25f ? 2
                       : a < 1.75f  ? 3
                       : a <= 2.5f  ? 4
                       : a < 3.5f   ? 5
                       : a <= 5.0f  ? 6
                                    : 7;
  return static_cast<uint8_t>(std::signbit(v) ? code | 8u : code);
}

float mxfp4_group_codes(const float* x, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t k = 0; k < kMxfp4GroupSize; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float s = std::max(e2m1_pow2_scale(amax), kFp8MinBlockScale);
  float cmax = 0.0f;
  for (int64_t k = 0; k < kMxfp4GroupSize; ++k) {
    codes[k] = e2m1_code(x[k] / s);
    cmax = std::max(cmax, std::fabs(e2m1_value(codes[k])));
  }
  if (cmax == 0.0f || cmax > 3.0f || s == kFp8MinBlockScale) return s;
  for (int64_t k = 0; k < kMxfp4GroupSize; ++k) codes[k] = e2m1_code(e2m1_value(codes[k]) * 2.0f);
  return s * 0.5f;
}

namespace {

void quantize_group(float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return;
    amax = std::max(amax, std::fabs(x[i]));
  }
  const float s = fp8_pow2_scale(amax);
  for (int64_t i = 0; i < n; ++i) x[i] = fp8_to_f32(f32_to_fp8(x[i] / s, /*saturate=*/true)) * s;
}

}  // namespace

namespace detail {

int64_t check_fp8_quantize_rows(const Tensor& x, int64_t group) {
  LS_CHECK(x.dtype == DType::F32 && x.ndim == 2)
      << "fp8_quantize_rows: x must be (T, K) f32, got " << x.shape_str();
  LS_CHECK(group > 0) << "fp8_quantize_rows: group must be positive, got " << group;
  const int64_t K = x.shape[1];
  LS_CHECK(K <= 1 || x.stride[1] == 1) << "fp8_quantize_rows: rows must be contiguous, got " << x.shape_str();
  return K;
}

}  // namespace detail

void fp8_quantize_rows(const Context& ctx, Tensor x, int64_t group) {
  LS_GPU_DISPATCH(ctx, fp8_quantize_rows, x, group);
  const int64_t K = detail::check_fp8_quantize_rows(x, group), T = x.shape[0];
  float* base = static_cast<float*>(x.data);
  ctx.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < K; k += group)
        quantize_group(base + t * x.stride[0] + k, std::min(group, K - k));
  });
}

}  // namespace lockstep::kernels
