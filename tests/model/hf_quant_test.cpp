// DeepSeek checkpoint formats: exhaustive e4m3 / e2m1 / ue8m0 code tables
// against values computed by hand, FP8 128x128-block and MXFP4 quantization
// against an independent brute-force reference (nearest code by search),
// error bounds, edge blocks, the canonical scale that makes re-quantizing a
// dequantized tensor give back the same bytes, and safetensors I/O of the
// F8_E4M3 / F8_E8M0 / I8 / I32 / I64 dtypes.
#include "lockstep/model/hf_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "lockstep/model/safetensors.h"
#include "model/model_test_util.h"

namespace lockstep {
namespace {

using test::expect_error;
using test::TempDir;

uint32_t bits(float f) {
  return f32_bits(f);
}

// ---- code tables, by hand ----

// e4m3fn by its definition: bias 7, 3 mantissa bits, S.1111.111 NaN, no inf.
double e4m3_by_hand(int code) {
  const int sign = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return sign ? -mag : mag;
}

TEST(HfQuantCodes, E4M3DecodeIsExhaustivelyTheDefinition) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_by_hand(c);
    const float got = fp8_to_f32(static_cast<fp8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      continue;
    }
    EXPECT_EQ(got, static_cast<float>(want)) << "code " << c;
    EXPECT_EQ(std::signbit(got), c >= 128) << "code " << c;  // 0x80 is -0
  }
  EXPECT_EQ(fp8_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_to_f32(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(fp8_to_f32(0x08), 0.015625f);     // 2^-6, the smallest normal
  EXPECT_TRUE(std::isnan(fp8_to_f32(0x7f)) && std::isnan(fp8_to_f32(0xff)));
}

TEST(HfQuantCodes, E2M1TableIsTheSpecTable) {
  const float table[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(bits(e2m1_to_f32(static_cast<uint8_t>(c))), bits(table[c])) << "nibble " << c;
    EXPECT_EQ(bits(e2m1_to_f32(static_cast<uint8_t>(c | 0xf0))), bits(table[c])) << "high bits are ignored";
  }
}

TEST(HfQuantCodes, E8M0IsTwoToTheByteMinus127) {
  for (int e = 0; e < 255; ++e) {
    const float want = static_cast<float>(std::ldexp(1.0, e - 127));
    EXPECT_EQ(e8m0_to_f32(static_cast<uint8_t>(e)), want) << "byte " << e;
    EXPECT_EQ(f32_to_e8m0(want), e) << "byte " << e;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  for (float bad : {3.0f, 0.0f, -1.0f, -0.5f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), 0x1p-128f, 0x1.8p-127f})
    expect_error([&] { f32_to_e8m0(bad); }, {"ue8m0", "power of two"});
}

// The e2m1 code nearest to v by search; a tie goes to the even code.
uint8_t e2m1_nearest(float v) {
  const double a = std::fabs(static_cast<double>(v));
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - e2m1_to_f32(static_cast<uint8_t>(c)));
    const double db = std::fabs(a - e2m1_to_f32(static_cast<uint8_t>(best)));
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(std::signbit(v) ? best | 8 : best);
}

TEST(HfQuantCodes, E2M1RoundsToNearestTiesToEven) {
  // Ties by hand: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
  const std::pair<float, float> ties[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2},
                                          {2.5f, 2},  {3.5f, 4},  {5.0f, 4}};
  for (auto [x, want] : ties) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(x)), want) << x;
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-x)), -want) << -x;
  }
  EXPECT_EQ(f32_to_e2m1(-0.1f), 8);  // the sign survives rounding to zero
  EXPECT_EQ(f32_to_e2m1(7.0f), 7);   // saturates
  EXPECT_EQ(f32_to_e2m1(-std::numeric_limits<float>::infinity()), 15);
  for (float x = -6.5f; x <= 6.5f; x += 1.0f / 64) EXPECT_EQ(f32_to_e2m1(x), e2m1_nearest(x)) << x;
}

// ---- references for the tensor conversions ----

// The e4m3 value nearest to y by search over the codes (ties to the even
// code); |y| <= 448.
float e4m3_nearest(float y) {
  const double a = std::fabs(static_cast<double>(y));
  int best = 0;
  for (int c = 1; c < 0x7f; ++c) {
    const double d = std::fabs(a - e4m3_by_hand(c)), db = std::fabs(a - e4m3_by_hand(best));
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  const float v = static_cast<float>(e4m3_by_hand(best));
  return std::signbit(y) ? -v : v;
}

// The smallest power of two s >= 2^-127 with amax / s <= limit, by search.
double pow2_scale_by_search(double amax, double limit) {
  if (amax == 0) return 1.0;
  for (int e = -127; e <= 127; ++e)
    if (amax / std::ldexp(1.0, e) <= limit) return std::ldexp(1.0, e);
  return std::ldexp(1.0, 127);
}

// What quantize then dequantize must give, computed independently:
// per 128x128 block, value = nearest_e4m3(w / s) * s with the searched s.
std::vector<float> fp8_reference(const std::vector<float>& w, int64_t out, int64_t in) {
  std::vector<float> r(w.size());
  for (int64_t i0 = 0; i0 < out; i0 += 128)
    for (int64_t j0 = 0; j0 < in; j0 += 128) {
      double amax = 0;
      for (int64_t i = i0; i < std::min(out, i0 + 128); ++i)
        for (int64_t j = j0; j < std::min(in, j0 + 128); ++j)
          amax = std::max(amax, std::fabs(double(w[i * in + j])));
      const double s = pow2_scale_by_search(amax, 448.0);
      for (int64_t i = i0; i < std::min(out, i0 + 128); ++i)
        for (int64_t j = j0; j < std::min(in, j0 + 128); ++j)
          r[i * in + j] = static_cast<float>(e4m3_nearest(static_cast<float>(w[i * in + j] / s)) * s);
    }
  return r;
}

std::vector<float> mxfp4_reference(const std::vector<float>& w, int64_t out, int64_t in) {
  std::vector<float> r(w.size());
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j0 = 0; j0 < in; j0 += 32) {
      double amax = 0;
      for (int64_t j = j0; j < j0 + 32; ++j) amax = std::max(amax, std::fabs(double(w[i * in + j])));
      const double s = pow2_scale_by_search(amax, 6.0);
      for (int64_t j = j0; j < j0 + 32; ++j)
        r[i * in + j] =
            static_cast<float>(e2m1_to_f32(e2m1_nearest(static_cast<float>(w[i * in + j] / s))) * s);
    }
  return r;
}

struct Fp8 {
  std::vector<fp8_t> q;
  std::vector<uint8_t> scale;
};

Fp8 fp8_quantize(const std::vector<float>& w, int64_t out, int64_t in) {
  const auto ss = fp8_scale_shape(out, in);
  Fp8 r{std::vector<fp8_t>(w.size()), std::vector<uint8_t>(static_cast<size_t>(ss[0] * ss[1]))};
  fp8_block_quantize(w.data(), out, in, r.q.data(), r.scale.data());
  return r;
}

std::vector<float> decode_scales(const std::vector<uint8_t>& s) {
  std::vector<float> f(s.size());
  for (size_t i = 0; i < s.size(); ++i) f[i] = e8m0_to_f32(s[i]);
  return f;
}

std::vector<float> fp8_dequantize(const Fp8& p, int64_t out, int64_t in) {
  std::vector<float> w(p.q.size());
  const auto sf = decode_scales(p.scale);
  fp8_block_dequantize(p.q.data(), sf.data(), out, in, w.data());
  return w;
}

// Values spanning many magnitudes, so blocks differ in scale and some
// elements fall in e4m3's subnormal range.
std::vector<float> varied(int64_t out, int64_t in, uint32_t seed) {
  auto w = test::randn(out * in, seed);
  const auto mag = test::uniform(out * in, seed + 1, -12.0f, 6.0f);
  for (size_t k = 0; k < w.size(); ++k) w[k] *= std::exp2(std::floor(mag[k]));
  return w;
}

// ---- FP8 blocks ----

TEST(HfQuantFp8, ScaleShapeRoundsUp) {
  EXPECT_EQ(fp8_scale_shape(1024, 4096), (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(fp8_scale_shape(200, 300), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(fp8_scale_shape(1, 129), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(fp8_scale_shape(0, 5), (std::vector<int64_t>{0, 1}));
}

TEST(HfQuantFp8, MatchesTheReferenceOnEdgeBlocks) {
  for (auto [out, in] :
       {std::pair<int64_t, int64_t>{200, 300}, {128, 128}, {1, 1}, {129, 1}, {3, 257}, {0, 7}}) {
    const auto w = varied(out, in, 7 + static_cast<uint32_t>(out));
    const Fp8 p = fp8_quantize(w, out, in);
    const auto back = fp8_dequantize(p, out, in);
    const auto ref = fp8_reference(w, out, in);
    for (size_t k = 0; k < w.size(); ++k)
      ASSERT_EQ(bits(back[k]), bits(ref[k])) << out << "x" << in << " at " << k;
  }
}

TEST(HfQuantFp8, ErrorIsWithinHalfAStep) {
  const int64_t out = 200, in = 300;
  const auto w = varied(out, in, 11);
  const Fp8 p = fp8_quantize(w, out, in);
  const auto back = fp8_dequantize(p, out, in);
  const auto sf = decode_scales(p.scale);
  std::vector<double> amax(6, 0.0);  // per block
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      double& a = amax[static_cast<size_t>((i / 128) * 3 + j / 128)];
      a = std::max(a, std::fabs(double(w[i * in + j])));
    }
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      const size_t b = static_cast<size_t>((i / 128) * 3 + j / 128);
      const double s = pow2_scale_by_search(amax[b], 448.0), x = w[i * in + j];
      EXPECT_TRUE(sf[b] == s || sf[b] == s / 2) << "the rule's scale, or half of it in canonical form";
      // 3 mantissa bits: half a step is 2^-4 of the value; subnormals: 2^-10 * s.
      EXPECT_LE(std::fabs(back[i * in + j] - x), std::max(std::fabs(x) / 16, s / 1024)) << i << ", " << j;
    }
}

TEST(HfQuantFp8, DequantizeUsesTheBlockOfEachElement) {
  // 130 x 130: four blocks with scales 2^0, 2^1, 2^-1, 2^3 (row-major grid); code 0x38 = 1.
  const int64_t n = 130;
  std::vector<fp8_t> q(n * n, 0x38);
  const float scale[4] = {1.0f, 2.0f, 0.5f, 8.0f};
  std::vector<float> w(n * n);
  fp8_block_dequantize(q.data(), scale, n, n, w.data());
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[127], 1.0f);
  EXPECT_EQ(w[128], 2.0f);
  EXPECT_EQ(w[127 * n + 129], 2.0f);
  EXPECT_EQ(w[128 * n + 127], 0.5f);
  EXPECT_EQ(w[129 * n + 128], 8.0f);
}

TEST(HfQuantFp8, RoundTripGivesBackTheSameBytes) {
  const int64_t out = 200, in = 300;
  auto w = varied(out, in, 5);
  // Block (0, 0): amax 225 gives s = 1 and largest code 224: the canonical
  // form halves s. Block (0, 1): all zero (and one -0). Block (1, 2): tiny.
  for (int64_t i = 0; i < 128; ++i)
    for (int64_t j = 0; j < 128; ++j) w[i * in + j] = std::fmod(w[i * in + j], 200.0f);
  w[5 * in + 9] = -225.0f;
  for (int64_t i = 0; i < 128; ++i)
    for (int64_t j = 128; j < 256; ++j) w[i * in + j] = 0.0f;
  w[3 * in + 130] = -0.0f;
  for (int64_t i = 128; i < out; ++i)
    for (int64_t j = 256; j < in; ++j) w[i * in + j] *= 1e-39f;
  const Fp8 p = fp8_quantize(w, out, in);
  EXPECT_EQ(p.scale[0], 126) << "amax 225: s = 1 holds it as 224, so 2^-1 with codes doubled";
  EXPECT_EQ(p.q[5 * in + 9], 0xfe) << "-448";
  EXPECT_EQ(p.scale[1], 127) << "an all-zero block has scale 1";
  EXPECT_EQ(p.q[3 * in + 130], 0x80) << "-0 is kept";
  EXPECT_EQ(p.scale[5], 0) << "the smallest ue8m0 scale, 2^-127";
  const auto back = fp8_dequantize(p, out, in);
  const auto ref = fp8_reference(w, out, in);
  for (size_t k = 0; k < w.size(); ++k) ASSERT_EQ(bits(back[k]), bits(ref[k])) << k;
  const Fp8 again = fp8_quantize(back, out, in);
  EXPECT_EQ(again.q, p.q);
  EXPECT_EQ(again.scale, p.scale);
}

TEST(HfQuantFp8, NonFiniteInputIsAnErrorNamingTheElement) {
  std::vector<float> w(6, 1.0f);
  std::vector<fp8_t> q(6);
  uint8_t s[1];
  w[4] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { fp8_block_quantize(w.data(), 2, 3, q.data(), s, "layers.0.attn.wq_a.weight"); },
               {"layers.0.attn.wq_a.weight", "non-finite", "(1, 1)"});
  w[4] = std::numeric_limits<float>::infinity();
  expect_error([&] { fp8_block_quantize(w.data(), 2, 3, q.data(), s, "w"); }, {"w", "inf"});
}

// ---- MXFP4 ----

struct Mx {
  std::vector<uint8_t> packed, scale;
};

Mx mx_quantize(const std::vector<float>& w, int64_t out, int64_t in) {
  Mx r{std::vector<uint8_t>(w.size() / 2), std::vector<uint8_t>(w.size() / 32)};
  mxfp4_quantize(w.data(), out, in, r.packed.data(), r.scale.data());
  return r;
}

std::vector<float> mx_dequantize(const Mx& m, int64_t out, int64_t in) {
  std::vector<float> w(static_cast<size_t>(out * in));
  const auto sf = decode_scales(m.scale);
  mxfp4_dequantize(m.packed.data(), sf.data(), out, in, w.data());
  return w;
}

TEST(HfQuantMxfp4, ShapesNeedWholeGroups) {
  EXPECT_EQ(mxfp4_packed_shape(2048, 4096), (std::vector<int64_t>{2048, 2048}));
  EXPECT_EQ(mxfp4_scale_shape(2048, 4096), (std::vector<int64_t>{2048, 128}));
  expect_error([] { mxfp4_packed_shape(4, 48); }, {"multiple of 32", "48"});
  expect_error([] { mxfp4_scale_shape(4, 16); }, {"multiple of 32", "16"});
  std::vector<uint8_t> b(64);
  std::vector<float> f(64);
  expect_error([&] { mxfp4_quantize(f.data(), 2, 40, b.data(), b.data(), "ffn.experts.0.w1.weight"); },
               {"ffn.experts.0.w1.weight", "multiple of 32", "40"});
  expect_error([&] { mxfp4_dequantize(b.data(), f.data(), 1, 33, f.data(), "x"); }, {"x", "multiple of 32"});
}

TEST(HfQuantMxfp4, LowNibbleIsTheEvenElement) {
  // One row of 64: byte k holds elements 2k (low) and 2k + 1 (high).
  std::vector<uint8_t> packed(32, 0);
  packed[0] = 0x21;   // element 0 = 0.5, element 1 = 1
  packed[1] = 0xf7;   // element 2 = 6, element 3 = -6
  packed[16] = 0x9a;  // element 32 = -1 (0xa), element 33 = -0.5 (0x9)
  const float scale[2] = {1.0f, 4.0f};
  std::vector<float> w(64);
  mxfp4_dequantize(packed.data(), scale, 1, 64, w.data());
  EXPECT_EQ(w[0], 0.5f);
  EXPECT_EQ(w[1], 1.0f);
  EXPECT_EQ(w[2], 6.0f);
  EXPECT_EQ(w[3], -6.0f);
  EXPECT_EQ(w[32], -4.0f);  // second group: scale 4
  EXPECT_EQ(w[33], -2.0f);
  EXPECT_EQ(w[4], 0.0f);
  const Mx back = mx_quantize(w, 1, 64);
  EXPECT_EQ(back.packed[0], 0x21);
  EXPECT_EQ(back.packed[1], 0xf7);
}

TEST(HfQuantMxfp4, MatchesTheReferenceAndBound) {
  const int64_t out = 5, in = 96;
  const auto w = varied(out, in, 3);
  const Mx m = mx_quantize(w, out, in);
  const auto back = mx_dequantize(m, out, in);
  const auto ref = mxfp4_reference(w, out, in);
  const auto sf = decode_scales(m.scale);
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      const size_t k = static_cast<size_t>(i * in + j);
      ASSERT_EQ(bits(back[k]), bits(ref[k])) << i << ", " << j;
      double amax = 0;
      for (int64_t j2 = j / 32 * 32; j2 < j / 32 * 32 + 32; ++j2)
        amax = std::max(amax, std::fabs(double(w[i * in + j2])));
      const double s = pow2_scale_by_search(amax, 6.0);
      EXPECT_TRUE(sf[static_cast<size_t>(i * 3 + j / 32)] == s ||
                  sf[static_cast<size_t>(i * 3 + j / 32)] == s / 2);
      // 1 mantissa bit: half a step is 1/4 of the value; below 1: 0.25 * s.
      EXPECT_LE(std::fabs(double(back[k]) - w[k]), std::max(std::fabs(double(w[k])) / 4, s / 4))
          << i << ", " << j;
    }
}

TEST(HfQuantMxfp4, RoundTripGivesBackTheSameBytes) {
  const int64_t out = 3, in = 128;
  auto w = varied(out, in, 9);
  // Group (0, 0): amax 3.2 gives s = 1 and largest code 3: canonical s = 1/2.
  for (int64_t j = 0; j < 32; ++j) w[j] = std::fmod(w[j], 1.0f);
  w[7] = 3.2f;
  for (int64_t j = 32; j < 64; ++j) w[j] = 0.0f;  // group (0, 1): zero
  w[40] = -0.0f;
  for (int64_t j = 64; j < 96; ++j) w[j] *= 1e-40f;  // group (0, 2): under 2^-127 * 6
  const Mx m = mx_quantize(w, out, in);
  EXPECT_EQ(m.scale[0], 126);
  EXPECT_EQ(m.packed[3] >> 4, 7) << "3.2 at scale 1/2 is code 7 (6)";
  EXPECT_EQ(m.scale[1], 127);
  EXPECT_EQ(m.packed[20] & 0xf, 8) << "-0 is kept";
  EXPECT_EQ(m.scale[2], 0);
  const auto back = mx_dequantize(m, out, in);
  const auto ref = mxfp4_reference(w, out, in);
  for (size_t k = 0; k < w.size(); ++k) ASSERT_EQ(bits(back[k]), bits(ref[k])) << k;
  const Mx again = mx_quantize(back, out, in);
  EXPECT_EQ(again.packed, m.packed);
  EXPECT_EQ(again.scale, m.scale);
}

TEST(HfQuantMxfp4, NonFiniteInputIsAnError) {
  std::vector<float> w(32, 0.0f);
  w[31] = -std::numeric_limits<float>::infinity();
  std::vector<uint8_t> p(16), s(1);
  expect_error([&] { mxfp4_quantize(w.data(), 1, 32, p.data(), s.data(), "e"); },
               {"e", "non-finite", "(0, 31)"});
}

// ---- safetensors I/O of these dtypes ----

TEST(HfQuantSafetensors, RawDtypesRoundTrip) {
  TempDir dir("hfq-raw");
  std::vector<uint8_t> f8(256), e8(6);
  for (int c = 0; c < 256; ++c) f8[c] = static_cast<uint8_t>(c);
  for (int k = 0; k < 6; ++k) e8[k] = static_cast<uint8_t>(120 + k);
  e8[5] = 0xff;
  const int8_t i8[4] = {-128, -1, 0, 127};
  const int32_t i32[3] = {-7, 0, 2147483647};
  const int64_t i64[2] = {-5, int64_t{1} << 40};
  const float f32[2] = {1.5f, -2.0f};
  std::vector<SafetensorsTensor> ts = {
      {"w.weight", {16, 16}, nullptr, f8.data(), "F8_E4M3"},
      {"w.scale", {2, 3}, nullptr, e8.data(), "F8_E8M0"},
      {"a", {4}, nullptr, i8, "I8"},
      {"b", {3}, nullptr, i32, "I32"},
      {"c", {1, 2}, nullptr, i64, "I64"},
      {"d", {2}, f32},
  };
  const std::string path = dir.str("m.safetensors");
  write_safetensors(path, ts, DType::BF16);
  SafetensorsFile f(path);
  EXPECT_EQ(f.find("w.weight")->dtype, "F8_E4M3");
  EXPECT_EQ(f.find("w.scale")->dtype, "F8_E8M0");
  EXPECT_EQ(f.find("a")->dtype, "I8");
  EXPECT_EQ(f.find("b")->dtype, "I32");
  EXPECT_EQ(f.find("c")->dtype, "I64");
  EXPECT_EQ(f.find("d")->dtype, "BF16") << "f32 values take the writer's dtype";
  std::vector<uint8_t> raw(256);
  f.read_bytes(*f.find("w.weight"), raw.data());
  EXPECT_EQ(raw, f8);
  std::vector<float> vals(256);
  f.read_f32(*f.find("w.weight"), vals.data());
  for (int c = 0; c < 256; ++c)
    if (!std::isnan(e4m3_by_hand(c))) {
      EXPECT_EQ(vals[c], static_cast<float>(e4m3_by_hand(c))) << c;
    }
  f.read_f32(*f.find("w.scale"), vals.data());
  EXPECT_EQ(vals[0], 0x1p-7f);
  EXPECT_EQ(vals[4], 0x1p-3f);
  EXPECT_TRUE(std::isnan(vals[5]));
  int64_t ints[4];
  f.read_i64(*f.find("a"), ints);
  EXPECT_EQ((std::vector<int64_t>(ints, ints + 4)), (std::vector<int64_t>{-128, -1, 0, 127}));
  f.read_i64(*f.find("b"), ints);
  EXPECT_EQ((std::vector<int64_t>(ints, ints + 3)), (std::vector<int64_t>{-7, 0, 2147483647}));
  f.read_i64(*f.find("c"), ints);
  EXPECT_EQ((std::vector<int64_t>(ints, ints + 2)), (std::vector<int64_t>{-5, int64_t{1} << 40}));
  expect_error([&] { f.read_i64(*f.find("d"), ints); }, {path, "'d'", "BF16", "integers"});
  expect_error([&] { f.read_f32(*f.find("c"), vals.data()); }, {path, "'c'", "I64"});
}

TEST(HfQuantSafetensors, BadRawTensorsAreErrors) {
  TempDir dir("hfq-bad");
  const uint8_t b[4] = {};
  const float f[1] = {};
  expect_error(
      [&] {
        write_safetensors(dir.str("x.safetensors"), {{"t", {4}, nullptr, b, "F4"}}, DType::F32);
      },
      {"'t'", "unknown safetensors dtype 'F4'"});
  expect_error(
      [&] {
        write_safetensors(dir.str("x.safetensors"), {{"t", {1}, f, b, "I8"}}, DType::F32);
      },
      {"'t'", "not both"});
}

TEST(HfQuantSafetensors, ShardedSetsMixDtypes) {
  TempDir dir("hfq-shards");
  std::vector<uint8_t> f8(300, 0x38);
  const uint8_t e8[2] = {127, 128};
  const int64_t ids[6] = {0, 1, 2, 3, 1, 0};
  std::vector<float> x(100, 0.25f);
  std::vector<SafetensorsTensor> ts = {{"p.weight", {3, 100}, nullptr, f8.data(), "F8_E4M3"},
                                       {"p.scale", {1, 2}, nullptr, e8, "F8_E8M0"},
                                       {"g.tid2eid", {3, 2}, nullptr, ids, "I64"},
                                       {"n.weight", {100}, x.data()}};
  const auto written = write_safetensors_sharded(dir.str(), ts, DType::F32, 40);
  ASSERT_EQ(written.size(), 5u);  // four shards and the index
  const auto idx = nlohmann::json::parse(test::read_bytes(dir.str("model.safetensors.index.json")));
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), 300u + 2 + 48 + 400);
  SafetensorsCheckpoint ck(dir.str());
  EXPECT_TRUE(ck.sharded());
  auto loc = ck.locate("g.tid2eid");
  EXPECT_EQ(loc.entry->dtype, "I64");
  int64_t back[6];
  loc.file->read_i64(*loc.entry, back);
  EXPECT_EQ(std::memcmp(back, ids, sizeof ids), 0);
  EXPECT_EQ(ck.locate("p.scale").entry->dtype, "F8_E8M0");
  EXPECT_EQ(ck.locate("n.weight").entry->dtype, "F32");
}

}  // namespace
}  // namespace lockstep
