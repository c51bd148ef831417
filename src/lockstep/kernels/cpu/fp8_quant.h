// FP8 (e4m3fn) scaling shared by weight packing and activation quantization.
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

}  // namespace lockstep::kernels
