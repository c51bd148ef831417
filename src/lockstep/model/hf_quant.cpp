// FP8 block and MXFP4 conversions of DeepSeek checkpoints (power-of-two
// scales, so every scaling is exact and a block's bytes depend on it alone).
#include "lockstep/model/hf_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/fp8_quant.h"

namespace lockstep {

namespace {

// ue8m0's smallest scale, 2^-127 (an f32 subnormal, exact).
constexpr float kMinScale = 0x1p-127f;
static_assert(kMxfp4Group == kernels::kMxfp4GroupSize, "one MXFP4 group size");

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void check_dims(int64_t out, int64_t in, std::string_view what) {
  if (out < 0 || in < 0) LS_THROW << what << ": negative shape (" << out << ", " << in << ")";
}

void check_mxfp4_in(int64_t in, std::string_view what) {
  if (in % kMxfp4Group != 0)
    LS_THROW << what << ": MXFP4 needs the input width to be a multiple of " << kMxfp4Group << ", got " << in;
}

[[noreturn]] void throw_non_finite(std::string_view what, int64_t i, int64_t j, float v) {
  LS_THROW << what << ": cannot quantize the non-finite value " << v << " at (" << i << ", " << j << ")";
}

}  // namespace

// ---- scalar codes ----

float e8m0_to_f32(uint8_t e) {
  if (e == 0xff) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return kMinScale;
  return bits_f32(static_cast<uint32_t>(e) << 23);  // f32 exponent field e: 2^(e - 127)
}

uint8_t f32_to_e8m0(float pow2) {
  int e = 0;
  const float m = std::isfinite(pow2) && pow2 > 0.0f ? std::frexp(pow2, &e) : 0.0f;
  // pow2 = 0.5 * 2^e = 2^(e - 1); ue8m0 byte = (e - 1) + 127.
  if (m != 0.5f || e - 1 < -127 || e - 1 > 127)
    LS_THROW << "ue8m0 scale: " << pow2 << " is not a power of two in [2^-127, 2^127]";
  return static_cast<uint8_t>(e - 1 + 127);
}

float e2m1_to_f32(uint8_t nibble) {
  return kernels::e2m1_value(nibble);
}

uint8_t f32_to_e2m1(float v) {
  return kernels::e2m1_code(v);
}

// ---- shapes ----

std::vector<int64_t> fp8_scale_shape(int64_t out, int64_t in) {
  return {ceil_div(out, kFp8WeightBlock), ceil_div(in, kFp8WeightBlock)};
}

std::vector<int64_t> mxfp4_packed_shape(int64_t out, int64_t in) {
  check_mxfp4_in(in, "MXFP4 weight");
  return {out, in / 2};
}

std::vector<int64_t> mxfp4_scale_shape(int64_t out, int64_t in) {
  check_mxfp4_in(in, "MXFP4 weight");
  return {out, in / kMxfp4Group};
}

// ---- FP8 blocks ----

void fp8_block_dequantize(const fp8_t* q, const float* scale, int64_t out, int64_t in, float* dst) {
  check_dims(out, in, "fp8_block_dequantize");
  const int64_t KB = ceil_div(in, kFp8WeightBlock);
  for (int64_t i = 0; i < out; ++i) {
    const float* srow = scale + (i / kFp8WeightBlock) * KB;
    for (int64_t j = 0; j < in; ++j) dst[i * in + j] = fp8_to_f32(q[i * in + j]) * srow[j / kFp8WeightBlock];
  }
}

namespace {

// One block [i0, i1) x [j0, j1) of fp8_block_quantize; returns its scale
// (the rule of kernels::fp8_block_scale, which pack_weight applies too).
float fp8_quantize_block(const float* w, int64_t in, int64_t i0, int64_t i1, int64_t j0, int64_t j1, fp8_t* q,
                         std::string_view what) {
  float amax = 0.0f;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = j0; j < j1; ++j) {
      const float v = w[i * in + j];
      if (!std::isfinite(v)) throw_non_finite(what, i, j, v);
      amax = std::max(amax, std::fabs(v));
    }
  const kernels::Fp8BlockScale b = kernels::fp8_block_scale(amax);
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = j0; j < j1; ++j) q[i * in + j] = kernels::fp8_block_code(w[i * in + j], b);
  return b.scale;
}

}  // namespace

void fp8_block_quantize(const float* w, int64_t out, int64_t in, fp8_t* q, uint8_t* scale,
                        std::string_view what) {
  check_dims(out, in, what);
  const int64_t B = kFp8WeightBlock;
  const int64_t KB = ceil_div(in, B);
  for (int64_t bi = 0; bi * B < out; ++bi)
    for (int64_t bj = 0; bj * B < in; ++bj) {
      const float s = fp8_quantize_block(w, in, bi * B, std::min(out, (bi + 1) * B), bj * B,
                                         std::min(in, (bj + 1) * B), q, what);
      scale[bi * KB + bj] = f32_to_e8m0(s);
    }
}

// ---- MXFP4 ----

void mxfp4_dequantize(const uint8_t* packed, const float* scale, int64_t out, int64_t in, float* dst,
                      std::string_view what) {
  check_dims(out, in, what);
  check_mxfp4_in(in, what);
  const int64_t G = in / kMxfp4Group;
  for (int64_t i = 0; i < out; ++i) {
    const uint8_t* prow = packed + i * (in / 2);
    for (int64_t k = 0; k < in / 2; ++k) {
      const float s = scale[i * G + (2 * k) / kMxfp4Group];  // 2k and 2k + 1 share a group
      dst[i * in + 2 * k] = e2m1_to_f32(prow[k] & 0x0fu) * s;
      dst[i * in + 2 * k + 1] = e2m1_to_f32(prow[k] >> 4) * s;
    }
  }
}

namespace {

// One group of 32 values x[0, 32) into codes[0, 32); returns its scale
// (kernels::mxfp4_group_codes, the rule the packed experts share).
float mxfp4_quantize_group(const float* x, uint8_t* codes, int64_t i, int64_t j0, std::string_view what) {
  for (int64_t k = 0; k < kMxfp4Group; ++k)
    if (!std::isfinite(x[k])) throw_non_finite(what, i, j0 + k, x[k]);
  return kernels::mxfp4_group_codes(x, codes);
}

}  // namespace

void mxfp4_quantize(const float* w, int64_t out, int64_t in, uint8_t* packed, uint8_t* scale,
                    std::string_view what) {
  check_dims(out, in, what);
  check_mxfp4_in(in, what);
  const int64_t G = in / kMxfp4Group;
  uint8_t codes[kMxfp4Group];
  for (int64_t i = 0; i < out; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t j0 = g * kMxfp4Group;
      scale[i * G + g] = f32_to_e8m0(mxfp4_quantize_group(w + i * in + j0, codes, i, j0, what));
      uint8_t* dst = packed + i * (in / 2) + j0 / 2;
      for (int64_t k = 0; k < kMxfp4Group; k += 2)
        dst[k / 2] = static_cast<uint8_t>(codes[k] | (codes[k + 1] << 4));
    }
}

}  // namespace lockstep
