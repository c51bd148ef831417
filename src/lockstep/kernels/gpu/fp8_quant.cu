// GPU fp8 activation quantizer (kernels/cpu/fp8_quant.h fp8_quantize_rows):
// one thread per (row, group of channels), the CPU's steps in its order: the
// group's amax (a group with a NaN or an infinity is left as it is), the
// power-of-two scale by fp8_pow2_scale's rule (frexp and ldexp on the bits),
// then x = e4m3(x / s) * s with numerics.h's conversion (the CPU's bits).
#include "lockstep/kernels/cpu/fp8_quant.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/rows.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_mul;

constexpr float kE4M3Max = 448.0f;  // tensor/dtype.h kFp8E4M3Max (not a device header)

LS_DEVICE inline bool finite(float v) {
  return (num::bits(v) & 0x7f800000u) != 0x7f800000u;
}
LS_DEVICE inline float magnitude(float v) {
  return num::from_bits(num::bits(v) & 0x7fffffffu);
}

// std::frexp's exponent: v = m * 2^e with m in [0.5, 1); 0 for v == 0. v is
// finite and not negative.
LS_DEVICE inline int frexp_exponent(float v) {
  const uint32_t u = num::bits(v);
  const int be = static_cast<int>(u >> 23);
  if (be != 0) return be - 126;
  uint32_t man = u & 0x7fffffu;
  if (man == 0) return 0;
  int top = -1;  // the leading one's bit: v = 2^top * 1.x * 2^-149
  while (man != 0) {
    man >>= 1;
    ++top;
  }
  return top - 148;
}

// std::ldexp(1.0f, e): 2^e, 0 below the smallest subnormal (2^-150 rounds to
// even, 0), +inf above 2^127.
LS_DEVICE inline float pow2(int e) {
  if (e > 127) return num::from_bits(0x7f800000u);
  if (e >= -126) return num::from_bits(static_cast<uint32_t>(e + 127) << 23);
  if (e >= -149) return num::from_bits(1u << (e + 149));
  return 0.0f;
}

// fp8_pow2_scale (fp8_quant.cpp), step for step.
LS_DEVICE inline float pow2_scale(float amax) {
  if (!(amax > 0.0f) || !finite(amax)) return 1.0f;
  float s = pow2(frexp_exponent(ls_div(amax, kE4M3Max)));
  while (ls_div(amax, s) > kE4M3Max) s = ls_mul(s, 2.0f);
  while (ls_div(amax, ls_mul(s, 0.5f)) <= kE4M3Max) s = ls_mul(s, 0.5f);
  return s;
}

// Group g of row t is columns [g * group, min(K, (g + 1) * group)).
LS_GLOBAL void fp8_quantize_kernel(float* x, int64_t ld, int64_t T, int64_t K, int64_t group) {
  const int64_t groups = (K + group - 1) / group, n = T * groups;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t t = k / groups, c0 = (k % groups) * group;
    const int64_t w = K - c0 < group ? K - c0 : group;
    float* p = x + t * ld + c0;
    float amax = 0.0f;
    bool all_finite = true;
    for (int64_t i = 0; i < w && all_finite; ++i) {
      all_finite = finite(p[i]);
      const float a = magnitude(p[i]);
      amax = amax < a ? a : amax;  // std::max(amax, |x|)
    }
    if (!all_finite) continue;
    const float s = pow2_scale(amax);
    for (int64_t i = 0; i < w; ++i)
      p[i] = ls_mul(num::fp8_e4m3_to_f32(num::f32_to_fp8_e4m3(ls_div(p[i], s), /*saturate=*/true)), s);
  }
}

}  // namespace

void fp8_quantize_rows(const Context& ctx, Tensor x, int64_t group, const RowsLaunch& cfg) {
  const int64_t K = kernels::detail::check_fp8_quantize_rows(x, group), T = x.shape[0];
  check_rows_launch(cfg);
  const int64_t n = T * ((K + group - 1) / group);
  if (n == 0) return;
  LS_LAUNCH(ctx, fp8_quantize_kernel, dim3(rows_grid(n, cfg)), dim3(static_cast<unsigned>(cfg.threads)))
  (x.f32(), x.stride[0], T, K, group);
}

void fp8_quantize_rows(const Context& ctx, Tensor x, int64_t group) {
  fp8_quantize_rows(ctx, x, group, RowsLaunch{});
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
