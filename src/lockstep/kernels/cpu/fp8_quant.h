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
