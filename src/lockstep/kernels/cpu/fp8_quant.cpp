// Power-of-two FP8 scales and the per-token, per-group activation quantizer.
#include "lockstep/kernels/cpu/fp8_quant.h"

#include <algorithm>
#include <cmath>

#include "lockstep/base/error.h"
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

void fp8_quantize_rows(const Context& ctx, Tensor x, int64_t group) {
  LS_CHECK(x.dtype == DType::F32 && x.ndim == 2)
      << "fp8_quantize_rows: x must be (T, K) f32, got " << x.shape_str();
  LS_CHECK(group > 0) << "fp8_quantize_rows: group must be positive, got " << group;
  const int64_t T = x.shape[0], K = x.shape[1];
  LS_CHECK(K <= 1 || x.stride[1] == 1) << "fp8_quantize_rows: rows must be contiguous, got " << x.shape_str();
  float* base = static_cast<float*>(x.data);
  ctx.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < K; k += group)
        quantize_group(base + t * x.stride[0] + k, std::min(group, K - k));
  });
}

}  // namespace lockstep::kernels
