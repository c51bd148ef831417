// The quantized storage formats of DeepSeek's Hugging Face checkpoints, to
// f32 and back: FP8 e4m3 weights with one ue8m0 (power-of-two) scale per
// 128 x 128 block, and MXFP4 routed experts (two e2m1 values per byte, one
// ue8m0 scale per 32 consecutive values of a row).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "lockstep/tensor/dtype.h"

namespace lockstep {

constexpr int64_t kFp8WeightBlock = 128;  // FP8 scale block, rows and columns
constexpr int64_t kMxfp4Group = 32;       // MXFP4 values per scale, along a row
constexpr float kE2M1Max = 6.0f;          // e2m1's largest magnitude

// ---- scalar codes ----

// ue8m0: byte e means 2^(e - 127), 0 gives 2^-127; 0xff is NaN. Exact.
float e8m0_to_f32(uint8_t e);
// The ue8m0 byte of a power of two in [2^-127, 2^127]; Error naming the
// value for anything else.
uint8_t f32_to_e8m0(float pow2);

// e2m1 nibble (low 4 bits of `nibble`): bit 3 is the sign, bits 0-2 index
// [0, 0.5, 1, 1.5, 2, 3, 4, 6]; so 8 is -0. Exact.
float e2m1_to_f32(uint8_t nibble);
// f32 -> e2m1 nibble, round to nearest, ties to the even code (the code
// whose mantissa bit is 0: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
// 2.5 -> 2, 3.5 -> 4, 5 -> 4); magnitudes above 5 (infinities too) give +-6;
// the sign is kept, so -0.1 gives -0. v must not be NaN.
uint8_t f32_to_e2m1(float v);

// ---- shapes ----

// The scale grid of an (out, in) FP8 weight: (ceil(out/128), ceil(in/128)).
std::vector<int64_t> fp8_scale_shape(int64_t out, int64_t in);
// An (out, in) MXFP4 weight: packed bytes (out, in/2), scales (out, in/32).
// Error unless in % 32 == 0.
std::vector<int64_t> mxfp4_packed_shape(int64_t out, int64_t in);
std::vector<int64_t> mxfp4_scale_shape(int64_t out, int64_t in);

// ---- whole tensors (row-major, contiguous) ----
// `what` (a tensor name) prefixes every error message.

// dst[i, j] = fp8_to_f32(q[i, j]) * scale[i / 128, j / 128]. q (out, in),
// scale (ceil(out/128), ceil(in/128)) as f32 (decoded ue8m0 bytes, or the
// f32 scales some checkpoints store), dst (out, in). Exact for ue8m0 scales
// (a product that overflows gives inf); NaN codes give NaN.
void fp8_block_dequantize(const fp8_t* q, const float* scale, int64_t out, int64_t in, float* dst);

// Quantizes w (out, in) to e4m3 codes q (out, in) with one ue8m0 scale byte
// per 128 x 128 block (blocks at the right and bottom edges are smaller):
//   amax = max |w| over the block
//   s    = kernels::fp8_pow2_scale(amax): the smallest power of two with
//          amax / s <= 448 (the rule of the FP8 forward), at least 2^-127
//          (ue8m0's smallest); an all-zero block gets s = 1
//   q    = e4m3(w / s), round to nearest even (never saturates: |w/s| <= 448)
// then, when the block's largest |q| is 224 (amax / s in (224, 232]) and
// s > 2^-127, s is halved and every code doubled, which is exact: the values
// stay those of the rule above, but the block's largest |q| is then in
// [240, 448] whenever s > 2^-127, so quantizing the dequantized block again
// gives back the same bytes (a checkpoint re-saves bit for bit). This is
// kernels::fp8_block_scale, the rule pack_weight stores its fp8 blocks by.
// A non-finite w is an Error naming the element.
void fp8_block_quantize(const float* w, int64_t out, int64_t in, fp8_t* q, uint8_t* scale,
                        std::string_view what = "tensor");

// dst[i, j] = e2m1(nibble j of row i) * scale[i, j / 32], where byte k of a
// row holds element 2k in its LOW nibble and element 2k + 1 in its high
// nibble. packed (out, in/2), scale (out, in/32) f32, dst (out, in). Exact
// for ue8m0 scales. Error unless in % 32 == 0.
void mxfp4_dequantize(const uint8_t* packed, const float* scale, int64_t out, int64_t in, float* dst,
                      std::string_view what = "tensor");

// Quantizes w (out, in) to MXFP4: per row and group of 32 values,
//   s = the smallest power of two with amax / s <= 6, at least 2^-127; an
//       all-zero group gets s = 1
//   code = f32_to_e2m1(w / s) (nearest, ties to even; never saturates)
// then, as for FP8, when the group's largest |code| is 3 and s > 2^-127,
// s is halved and the codes doubled (exact), so the values are the rule's
// and a dequantize-quantize round trip gives back the same bytes.
// packed (out, in/2) with the nibble order above, scale (out, in/32) ue8m0.
// Error unless in % 32 == 0, or for a non-finite w.
void mxfp4_quantize(const float* w, int64_t out, int64_t in, uint8_t* packed, uint8_t* scale,
                    std::string_view what = "tensor");

}  // namespace lockstep
