// FP8 (e4m3fn) scaling shared by weight packing and activation quantization,
// and the MXFP4 (e2m1 with a scale per 32) rule of routed-expert weights.
// Scales are powers of two, as DeepSeek's FP8 checkpoints store them (an
// exponent only), so dividing by a scale and multiplying back are exact and a
// quantized value's bits depend only on its own group.
#pragma once

#include <cstdint>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// The smallest power of two s with amax / s <= 448 (e4m3's largest finite
// value), so the group's largest magnitude lands in [224, 448]; 1 when amax is
// 0 or not finite.
float fp8_pow2_scale(float amax);

// The smallest fp8 weight-block scale, ue8m0's 2^-127 (an f32 subnormal, exact).
constexpr float kFp8MinBlockScale = 0x1p-127f;

// The scale of one fp8 weight block, the rule pack_weight and DeepSeek's
// checkpoint writer (hf_quant.h fp8_block_quantize) share:
//   s = max(fp8_pow2_scale(amax), 2^-127);  q = e4m3(w / s)
// then, when the block's largest |q| (that of amax) is at most 224 (not 0)
// and s > 2^-127, the scale is s / 2 and every code is doubled, which is
// exact: the values stay those of the rule above, but the block's largest |q|
// is then in [240, 448], so quantizing the dequantized block again gives back
// the same bytes (an exported checkpoint packs bit for bit as the original).
struct Fp8BlockScale {
  float scale = 1.0f;    // the block's stored scale (s or s / 2)
  bool doubled = false;  // codes are 2 * e4m3(w / (2 * scale))
};
Fp8BlockScale fp8_block_scale(float amax);
// The e4m3 code of w (finite, |w| <= the block's amax) in a block of scale b.
fp8_t fp8_block_code(float w, Fp8BlockScale b);

// ---- MXFP4: e2m1 values, one power-of-two scale per 32 along a row ----

constexpr int64_t kMxfp4GroupSize = 32;

// e2m1 nibble (low 4 bits): bit 3 is the sign, bits 0-2 index
// [0, 0.5, 1, 1.5, 2, 3, 4, 6]; so 8 is -0. Exact.
float e2m1_value(uint8_t nibble);
// f32 -> e2m1 nibble, round to nearest, ties to the even code (0.25 -> 0,
// 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); magnitudes
// above 5 (infinities too) give +-6; the sign is kept. v must not be NaN.
uint8_t e2m1_code(float v);

// The MXFP4 rule of one group of 32 finite values x, the one DeepSeek's
// checkpoints and the packed expert weights (pack_weight_mxfp4) share:
//   s = the smallest power of two with amax / s <= 6, at least 2^-127 (an
//       all-zero group gets 1);  code = e2m1_code(x / s)
// then, when the group's largest |code| is at most 3 (not 0) and s > 2^-127,
// s is halved and every code doubled (exact), so the values are the rule's
// and quantizing the dequantized group again gives back the same codes.
// Writes the 32 nibbles to `codes` and returns s.
float mxfp4_group_codes(const float* x, uint8_t* codes);

// In place, per row t of x (T, K) f32 (rows may be strided), per group of
// `group` consecutive channels g = [j*group, min(K, (j+1)*group)):
//   amax = max |x[t, g]|;  s = fp8_pow2_scale(amax)
//   x[t, k] = fp8_to_f32(e4m3(x[t, k] / s, round to nearest even)) * s
// i.e. the dynamic per-token, per-group activation quantization of an FP8
// forward, returned dequantized (the f32 values the GEMM then multiplies).
// A group holding a NaN or an infinity is left as it is (the step's loss is
// then non-finite and the step is skipped). Each row is independent, so a
// row's bits do not depend on the batch or the thread count.
void fp8_quantize_rows(const Context& ctx, Tensor x, int64_t group);

namespace detail {
// fp8_quantize_rows' argument checks, shared with the GPU entry (same
// messages); returns K, the row width.
int64_t check_fp8_quantize_rows(const Tensor& x, int64_t group);
}  // namespace detail

}  // namespace lockstep::kernels
