// Tests for the FP8 power-of-two scales and the per-token, per-group
// activation quantizer: a double-precision reference built from the e4m3
// value table, exactness of the scale rule, batch and thread invariance,
// non-finite groups, strided rows.
#include "lockstep/kernels/cpu/fp8_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/test_util.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::kernels {
namespace {

// Every finite non-negative e4m3fn value, ascending, as doubles.
std::vector<double> e4m3_grid() {
  std::vector<double> g;
  for (int b = 0; b < 0x7f; ++b) g.push_back(double(fp8_to_f32(static_cast<fp8_t>(b))));
  return g;  // 0x7f is NaN in e4m3fn
}

// Round |v| to the nearest grid value, ties to the even code (even index),
// saturating at 448; sign restored.
double round_e4m3(double v, const std::vector<double>& g) {
  const double a = std::fabs(v);
  if (a >= g.back()) return std::copysign(g.back(), v);
  size_t i = 0;
  while (g[i + 1] < a) ++i;
  const double lo = g[i], hi = g[i + 1];
  double r;
  if (a - lo < hi - a) r = lo;
  else if (hi - a < a - lo) r = hi;
  else r = (i % 2 == 0) ? lo : hi;
  return std::copysign(r, v);
}

// The scale rule in doubles: the smallest power of two s with amax / s <= 448.
double ref_scale(double amax) {
  if (amax == 0) return 1;
  double s = std::ldexp(1.0, -150);
  while (amax / s > 448.0) s *= 2;
  return s;
}

TEST(Fp8Quant, ScaleIsTheSmallestPowerOfTwoThatFits) {
  for (float amax : {1e-30f, 1e-6f, 0.5f, 1.0f, 3.0f, 447.9f, 448.0f, 448.1f, 896.0f, 1e6f, 3e38f}) {
    const float s = fp8_pow2_scale(amax);
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << amax;  // a power of two
    EXPECT_EQ(double(s), ref_scale(amax)) << amax;
    EXPECT_LE(amax / s, 448.0f) << amax;
    EXPECT_GT(amax / s, 224.0f) << amax;
  }
  EXPECT_EQ(fp8_pow2_scale(0.0f), 1.0f);
  EXPECT_EQ(fp8_pow2_scale(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(fp8_pow2_scale(std::numeric_limits<float>::quiet_NaN()), 1.0f);
}

TEST(Fp8Quant, RowsMatchDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const std::vector<double> grid = e4m3_grid();
  uint32_t seed = 3;
  for (int64_t T : {1, 5}) {
    for (int64_t K : {1, 7, 128, 300}) {
      for (int64_t group : {1, 16, 128}) {
        std::vector<float> x = test::randn(T * K, seed++, 2.5f);
        if (K > 3) x[2] = 0.0f;  // a zero inside a group
        std::vector<float> y = x;
        fp8_quantize_rows(ctx, Tensor(y.data(), DType::F32, {T, K}), group);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t k0 = 0; k0 < K; k0 += group) {
            const int64_t k1 = std::min(K, k0 + group);
            double amax = 0;
            for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(double(x[t * K + k])));
            const double s = ref_scale(amax);
            for (int64_t k = k0; k < k1; ++k) {
              const double want = round_e4m3(double(x[t * K + k]) / s, grid) * s;
              ASSERT_EQ(double(y[t * K + k]), want) << "T=" << T << " K=" << K << " group=" << group << " t=" << t
                                                    << " k=" << k << " x=" << x[t * K + k];
            }
          }
      }
    }
  }
}

TEST(Fp8Quant, QuantizedValuesAreFixedPoints) {
  // Quantizing an already quantized row changes nothing: the forward may
  // quantize a saved activation again and get the same bits.
  ThreadPool pool(1);
  Context ctx{&pool};
  std::vector<float> x = test::randn(3 * 200, 9, 4.0f);
  Tensor t(x.data(), DType::F32, {3, 200});
  fp8_quantize_rows(ctx, t, 128);
  const std::vector<float> once = x;
  fp8_quantize_rows(ctx, t, 128);
  test::expect_bits_equal(x.data(), once.data(), int64_t(x.size()), "requantized");
}

TEST(Fp8Quant, BatchAndThreadInvariant) {
  ThreadPool one(1), two(2);
  Context c1{&one}, c2{&two};
  const int64_t T = 37, K = 260;
  const std::vector<float> x = test::randn(T * K, 21, 3.0f);
  std::vector<float> all = x;
  fp8_quantize_rows(c2, Tensor(all.data(), DType::F32, {T, K}), 128);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(x.begin() + t * K, x.begin() + (t + 1) * K);
    fp8_quantize_rows(c1, Tensor(row.data(), DType::F32, {1, K}), 128);
    test::expect_bits_equal(row.data(), all.data() + t * K, K, "row alone vs in the batch");
  }
}

TEST(Fp8Quant, NonFiniteGroupsStayAndStridedRowsKeepTheirPadding) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const int64_t T = 2, K = 8, ld = 11;
  std::vector<float> x(T * ld, 7.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) x[t * ld + k] = 0.1f * float(k + 1) + float(t);
  x[0 * ld + 1] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before = x;
  Tensor v(x.data(), DType::F32, {T, K});
  v.stride[0] = ld;
  fp8_quantize_rows(ctx, v, 4);
  // Row 0, group 0 holds the NaN: unchanged. Its group 1 is quantized.
  for (int k = 0; k < 4; ++k) {
    if (k != 1) {
      EXPECT_EQ(x[k], before[k]) << k;
    }
  }
  EXPECT_TRUE(std::isnan(x[1]));
  bool changed = false;
  for (int64_t k = 4; k < K; ++k) changed = changed || x[k] != before[k];
  EXPECT_TRUE(changed) << "0.5..0.8 are not all e4m3 values at their scale";
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = K; k < ld; ++k) EXPECT_EQ(x[t * ld + k], 7.0f) << "padding touched";
}

}  // namespace
}  // namespace lockstep::kernels
